"""The Python examples of README.md and docs/*.md type-check with ``mypy --strict`` against
today's API, so a renamed argument or a changed return type shows up in the docs too.

Every ```python block is checked, each as its own module, all in one mypy run. A block may:

* start with a comment naming a file (``# myapp/tasks.py``): it is written there, so later
  blocks can import from it; ``# myapp/tasks.py (continued)`` appends to that file;
* follow an HTML comment ``<!-- checked with: ... -->`` (on the lines just above its fence): the
  comment's lines come first, unseen by a reader: the imports and names of the reader's own
  application the example uses (an engine, a table);
* follow ``<!-- not checked: why -->``: skipped. Keep these rare: a shell session shown as
  Python, say.

The same run checks two snippets of its own: the API's types (``assert_type``), and a misspelt
keyword that must be an error.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import fairq
from tests.support.paths import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FILE_HEADER = re.compile(r"#\s*([\w/]+\.py)(\s+\(continued\))?\s*$")
ERROR = re.compile(r"^(?P<file>[^:\n]+\.py):(?P<line>\d+): error: (?P<message>.*)$", re.M)

# The negative check: the misspelt keyword of the issue must be an error, or this test proves
# nothing about the examples.
MISSPELT = '''import fairq

app = fairq.App()


@app.task
def send_report(job: fairq.Job) -> None: ...


send_report.enqueue(tenant="acme", payload={"report": 7}, dealy=60)
'''

# What the API promises a type checker, beyond the docs: each line fails if a type turns to Any.
TYPED_API = '''from collections.abc import Coroutine
from typing import Any, assert_type

import fairq

app = fairq.App()


@app.periodic(cron="0 2 * * *", tenant="acme")
@app.task(queue="reports")
def nightly(job: fairq.Job) -> dict[str, int]:
    return {"pages": job.attempt}


@app.task
async def notify(job: fairq.Job) -> None: ...


assert_type(nightly, fairq.Task[dict[str, int]])
assert_type(notify, fairq.Task[Coroutine[Any, Any, None]])
assert_type(app.periodic(notify, cron="* * * * *", tenant="globex"), fairq.Task[Coroutine[Any, Any, None]])
assert_type(nightly.enqueue(tenant="acme", delay=60), int)
assert_type(nightly.enqueue_many([("acme", {}), ("globex", {}, "key-1")]), list[int])
assert_type(app.job(1), fairq.JobInfo | None)
'''


@dataclass
class Block:
    doc: Path
    line: int  # the line of the block's first code line in ``doc``
    code: list[str]
    prelude: list[str] = field(default_factory=list)
    prelude_line: int = 0  # the line of the prelude's first line in ``doc``
    skipped: str | None = None


def blocks(doc: Path) -> list[Block]:
    """The ```python blocks of ``doc`` with the marker comment just above each, if any."""
    lines = doc.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```python":
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        block = Block(doc, i + 2, lines[i + 1:end])
        if i > 0 and lines[i - 1].strip().endswith("-->"):
            start = next(j for j in range(i - 1, -1, -1) if lines[j].lstrip().startswith("<!--"))
            comment = "\n".join(lines[start:i]).strip()[4:-3].strip()
            if comment.startswith("not checked:"):
                block.skipped = comment.removeprefix("not checked:").strip()
                assert block.skipped, f"{doc.name}:{i + 1}: say why the block is not checked"
            elif comment.startswith("checked with:"):
                block.prelude = lines[start + 1:i - 1]
                block.prelude_line = start + 2
                assert lines[start].strip() == "<!-- checked with:" and lines[i - 1].strip() == "-->", (
                    f"{doc.name}:{start + 1}: write `<!-- checked with:`, the lines, then `-->`, "
                    "each on its own line")
        found.append(block)
        i = end + 1
    return found


@dataclass
class Module:
    """A file given to mypy, and where each of its lines comes from (doc, line)."""

    lines: list[str] = field(default_factory=list)
    origin: list[tuple[str, int]] = field(default_factory=list)

    def add(self, doc: Path, first: int, lines: list[str]) -> None:
        self.lines += lines
        self.origin += [(doc.relative_to(REPO).as_posix(), first + k) for k in range(len(lines))]


def modules(all_blocks: list[Block]) -> dict[str, Module]:
    out: dict[str, Module] = {}
    for b in all_blocks:
        if b.skipped is not None:
            continue
        header = FILE_HEADER.match(b.code[0]) if b.code else None
        if header and header.group(2):
            assert header.group(1) in out, (f"{b.doc.name}:{b.line}: continues "
                                            f"{header.group(1)}, which no block above starts")
            target = out[header.group(1)]
        else:
            name = header.group(1) if header else f"{b.doc.stem.lower()}_{b.line}.py"
            assert name not in out, f"{b.doc.name}:{b.line}: a second block named {name}"
            target = out[name] = Module()
        target.add(b.doc, b.prelude_line, b.prelude)
        target.add(b.doc, b.line, b.code)
    return out


def run_mypy(workdir: Path, files: dict[str, str]) -> str:
    """One mypy run over ``files`` (relative name: text), against the fairq being tested."""
    for name, text in files.items():
        path = workdir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        for package in path.relative_to(workdir).parents[:-1]:
            (workdir / package / "__init__.py").touch()
        path.write_text(text)
    (workdir / "fairq").symlink_to(Path(fairq.__file__).parent, target_is_directory=True)
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--config-file=", "--no-error-summary",
         "--show-error-codes", "--cache-dir", str(REPO / ".mypy_cache" / "doc-examples"),
         *files],
        cwd=workdir, capture_output=True, text=True, timeout=600,
        env={**os.environ, "MYPYPATH": ""},
    )
    assert proc.returncode in (0, 1), f"mypy did not run:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_the_docs_python_examples_type_check(tmp_path: Path) -> None:
    all_blocks = [b for doc in DOCS for b in blocks(doc)]
    assert sum(b.doc.name == "README.md" for b in all_blocks) >= 2, "no README example found"
    skipped = [b for b in all_blocks if b.skipped is not None]
    assert len(skipped) <= 2, "keep unchecked examples rare: " + ", ".join(
        f"{b.doc.name}:{b.line}" for b in skipped)
    checked = modules(all_blocks)
    files = {name: "\n".join(m.lines) + "\n" for name, m in checked.items()}
    files["negative_misspelt_keyword.py"] = MISSPELT
    files["typed_api.py"] = TYPED_API
    out = run_mypy(tmp_path, files)

    errors = [m for m in ERROR.finditer(out)]
    misspelt = [m for m in errors if m["file"] == "negative_misspelt_keyword.py"]
    assert any('"dealy"' in m["message"] and m["line"] == "10" for m in misspelt), (
        "mypy let `enqueue(..., dealy=60)` through: the task's enqueue is not typed\n" + out)

    typed = [f"typed_api.py:{m['line']}: {m['message']}" for m in errors if m["file"] == "typed_api.py"]
    assert not typed, "the API lost its types:\n" + "\n".join(typed)

    problems = []
    for m in errors:
        module = checked.get(m["file"])
        if module is None:
            continue  # the negative check, or fairq itself (checked by the mypy CI step)
        doc, line = module.origin[int(m["line"]) - 1]
        problems.append(f"{doc}:{line}: {m['message']}")
    assert not problems, "the docs' Python examples fail `mypy --strict`:\n" + "\n".join(problems)
