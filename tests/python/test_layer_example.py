"""Runs the two-layer IndexShare example of docs/layer.md (the README example), so it stays correct."""

import contextlib
import io
import re
from pathlib import Path

import flashdsa

DOC = Path(__file__).resolve().parents[2] / "docs" / "layer.md"
MARKER = "<!-- example: two-layer -->"


def example_code() -> str:
    text = DOC.read_text()
    match = re.search(re.escape(MARKER) + r"\s*```python\n(.*?)```", text, re.S)
    assert match, f"{DOC} has no python block after {MARKER}"
    return match.group(1)


def test_readme_shows_the_same_example():
    readme = (DOC.parents[1] / "README.md").read_text()
    assert example_code() in readme, "README.md's two-layer example must be the block of docs/layer.md"


def test_readme_example_runs_and_trains_the_indexer(monkeypatch):
    calls = []
    real = flashdsa.ops.indexer_topk
    monkeypatch.setattr(flashdsa.ops, "indexer_topk", lambda *a, **k: calls.append(1) or real(*a, **k))
    scope = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(example_code(), str(DOC), "exec"), scope)
    assert len(calls) == 1, "the shared layer must not run the indexer"
    loss = float(printed.getvalue().split(":")[-1])
    assert loss > 0
    assert scope["indexer"].weight.grad.abs().max() > 0, "the KL loss must reach the indexer"
    assert all(p.weight.grad.abs().max() > 0 for layer in scope["proj"] for p in layer)
