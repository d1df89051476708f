"""A stand-in application for the container recipe: replace it with your own tasks module."""

import fairq

app = fairq.App()


@app.task(queue="default")
def hello(job: fairq.Job) -> None:
    print(f"hello from {job.tenant}: {job.payload}", flush=True)
