"""The drain matrix's report (benchmarks/drain_matrix.py): ratios per repeat and the control."""

from __future__ import annotations

from typing import Any

from benchmarks import drain_matrix as dm


def _run(policy: str, rep: int, rate: float, done: bool = True) -> dict[str, Any]:
    return {"shape": "equal10", "policy": policy, "repeat": rep, "jobs": 100, "seconds": 100 / rate,
            "jobs_per_s": rate, "all_done": done, "undone": 0 if done else 1,
            "queued_stranded": 0, "running_left": 0, "queued_after_exit": 0,
            "empty_claims_with_work": 0, "empty_claims_with_uncapped_work": 0,
            "longest_stall_s": 0.0, "exit_code": 0, "stopped": None, "claim_errors": 0,
            "analyzed": False}


def test_paired_ratio_is_the_median_of_each_repeats_ratio_to_its_own_fifo_run() -> None:
    # The machine slows down in repeat 2: the ratio of medians (100 / 200 = 0.5) calls weighted
    # half as fast, while in every repeat it ran at 0.9x or better of the fifo run beside it.
    runs = [_run("fifo", 0, 200), _run("weighted", 0, 190),
            _run("fifo", 1, 200), _run("weighted", 1, 180),
            _run("fifo", 2, 50), _run("weighted", 2, 100)]
    rows = {r["policy"]: r for r in dm.summarize(runs, ["equal10"], ["fifo", "weighted"])}
    assert rows["weighted"]["x_fifo"] == 180 / 200
    assert rows["weighted"]["x_fifo_paired"] == 190 / 200
    assert "0.90x (paired 0.95x)" in dm.table(list(rows.values()))


def test_the_control_is_reported_as_noise_and_not_judged_as_a_fair_policy() -> None:
    runs = [_run("fifo", 0, 200), _run(dm.CONTROL, 0, 150), _run("drr", 0, 190)]
    rows = dm.summarize(runs, ["equal10"], ["fifo", dm.CONTROL, "drr"])
    report, verdict = dm.target_report(rows)
    assert verdict["ratio_met"]  # the control's 0.75x is not a fair policy's
    assert "fifo run twice (fifo_control), its second run x its first: 0.75x .. 0.75x" in report
    slow = dm.target_report(dm.summarize([*runs[:1], _run("drr", 0, 150)], ["equal10"],
                                         ["fifo", "drr"]))
    assert not slow[1]["ratio_met"] and "equal10/drr 0.750x" in slow[0]


def test_a_repeat_left_undone_has_no_paired_ratio() -> None:
    runs = [_run("fifo", 0, 200), _run("weighted", 0, 190, done=False)]
    rows = {r["policy"]: r for r in dm.summarize(runs, ["equal10"], ["fifo", "weighted"])}
    assert rows["weighted"]["x_fifo_paired"] is None and rows["weighted"]["x_fifo"] is None


def test_statements_table_gives_each_policy_its_own_claim_per_thousand_jobs() -> None:
    def run(policy: str, rep: int, claim_ms: float) -> dict[str, Any]:
        name = "claim_fifo" if policy in ("fifo", dm.CONTROL) else "claim_fair"
        return {**_run(policy, rep, 100.0), "done": 2000,
                "statements": {name: claim_ms, "finish_done": 40.0, "all": claim_ms + 50.0}}

    runs = [run("fifo", 0, 60.0), run("fifo", 1, 80.0), run("fifo", 2, 200.0),
            run("weighted", 0, 90.0), run("weighted", 1, 70.0), run("weighted", 2, 100.0)]
    lines = dm.statements_table(runs, ["equal10"], ["fifo", "weighted"]).splitlines()
    # medians over the repeats, per 1,000 of the 2,000 jobs each run did
    assert lines[2] == "| equal10 | fifo | 40.0 | 20.0 | 65.0 |"
    assert lines[3] == "| equal10 | weighted | 45.0 | 20.0 | 70.0 |"


def test_cpu_per_job_is_paired_with_the_fifo_run_of_the_same_repeat() -> None:
    def run(policy: str, rep: int, server_s: float, worker_s: float | None) -> dict[str, Any]:
        return {**_run(policy, rep, 100.0), "done": 2000, "server_cpu_s": server_s,
                "worker_cpu_s": worker_s}

    # Repeat 1 is twice as dear for both (a slower machine): the pairs stay 1.1x and 1.2x.
    runs = [run("fifo", 0, 2.0, 2.0), run("weighted", 0, 2.4, 2.0),
            run("fifo", 1, 4.0, 4.0), run("weighted", 1, 4.8, 4.8),
            run("fifo", 2, 2.0, None), run("weighted", 2, 9.0, 9.0)]  # no worker CPU: left out
    rows = {r["policy"]: r for r in dm.summarize(runs, ["equal10"], ["fifo", "weighted"])}
    w = rows["weighted"]
    assert w["cpu_x_fifo_paired"] == (4.4 / 4.0 + 9.6 / 8.0) / 2
    assert w["server_cpu_ms_per_k"] == 2400.0  # median of 1,200, 2,400 and 4,500 per 1,000 jobs
    assert "| 2400 + 2400 (1.15x) |" in dm.table(list(rows.values()))
    report, _ = dm.target_report(list(rows.values()))
    assert "fair x fifo, paired: 1.15x .. 1.15x" in report


def test_the_repeats_verdict_tells_a_gap_beyond_the_noise_from_one_within_it() -> None:
    def cell(policy: str, ratios: list[float]) -> list[dict[str, Any]]:
        return [_run(policy, rep, 100.0 * x) for rep, x in enumerate(ratios)]

    fifo = cell("fifo", [1.0] * 5)
    steady_slow = cell("weighted", [0.80, 0.82, 0.79, 0.81, 0.80])  # every repeat below 0.9x
    noisy = cell("drr", [0.70, 1.20, 0.85, 1.05, 0.95])  # the spread of fifo against itself
    steady_fast = cell("round_robin", [0.98, 1.02, 1.00, 0.97, 1.03])
    rows = dm.summarize([*fifo, *steady_slow, *noisy, *steady_fast], ["equal10"],
                        ["fifo", "weighted", "drr", "round_robin"])
    by = {r["policy"]: r for r in rows}
    mean, lo, hi = by["weighted"]["x_fifo_interval"]
    assert lo <= mean <= hi < 0.9
    assert by["drr"]["x_fifo_interval"][1] < 0.9 <= by["drr"]["x_fifo_interval"][2]
    assert by["round_robin"]["x_fifo_interval"][1] >= 0.9
    report, verdict = dm.target_report(rows)
    assert verdict["ratio_below_beyond_noise"] == ["equal10/weighted"]
    line = next(x for x in report.splitlines() if x.startswith("- the repeats' verdict"))
    assert "below 0.9x beyond the noise: equal10/weighted 0.80x" in line
    assert "at or above it beyond the noise: 1 of 3 fair cells" in line
    assert "undecided at this noise: equal10/drr" in line
    # Fewer than three repeats: no interval, no verdict line.
    two = dm.summarize([*fifo[:2], *steady_slow[:2]], ["equal10"], ["fifo", "weighted"])
    assert all(r["x_fifo_interval"] is None for r in two)
    assert "the repeats' verdict" not in dm.target_report(two)[0]


def test_with_the_control_a_fair_policy_is_measured_against_both_fifo_runs() -> None:
    # The machine slows through each repeat: fifo first, drr in the middle, the control last.
    # Against the first fifo run alone drr looks 0.8x; against both ends it runs at their mean.
    runs = [_run("fifo", rep, 200) for rep in range(3)]
    runs += [_run("drr", rep, 160) for rep in range(3)]
    runs += [_run(dm.CONTROL, rep, 128) for rep in range(3)]
    rows = {r["policy"]: r for r in dm.summarize(runs, ["equal10"], ["fifo", "drr", dm.CONTROL])}
    assert rows["drr"]["x_fifo_paired"] == 160 / (200 * 128) ** 0.5  # 1.0x
    assert rows["drr"]["x_fifo"] == 160 / 164  # the median of the six fifo runs' rates
    # The control stays the first fifo run's twin: its ratio is the noise, 0.64x here.
    assert rows[dm.CONTROL]["x_fifo"] == rows[dm.CONTROL]["x_fifo_paired"] == 128 / 200
    report, verdict = dm.target_report(list(rows.values()))
    assert verdict["ratio_met"] and "0.64x .. 0.64x" in report
    # A control run left undone: no fair ratio of medians (its rate is not a throughput).
    runs[-1] = _run(dm.CONTROL, 2, 128, done=False)
    rows = {r["policy"]: r for r in dm.summarize(runs, ["equal10"], ["fifo", "drr", dm.CONTROL])}
    assert rows["drr"]["x_fifo"] is None
