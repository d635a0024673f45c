"""Benchmark: standalone evaluation overhead over bare draft forwards, measured in one run.

Times, on the same batches: (a) the whole ``standalone.evaluate`` (reading the dump, wiring, target
labels, batching, scoring) and (b) only the draft's teacher-forced forwards and logits. Each is
repeated; the table shows medians and MADs, and the last line is JSON with ``overhead_ratio`` =
whole / bare (goal <= 1.25).

    python scripts/bench_standalone.py [--scenario tiny] [--rule "[:-1]"] [--steps 3] [--repeats 5]
"""

from __future__ import annotations

import json
import statistics
import time

import torch
import typer
from rich.console import Console
from rich.table import Table

from bisect_eagle.artifacts import scenarios
from bisect_eagle.artifacts.draft import load_draft
from bisect_eagle.artifacts.dumps import DumpReader
from bisect_eagle.artifacts.target import TargetHead
from bisect_eagle.artifacts.wiring import parse_rule
from bisect_eagle.trials.accuracy import batches, evaluate


def _median_mad(xs: list[float]) -> tuple[float, float]:
    med = statistics.median(xs)
    return med, statistics.median(abs(x - med) for x in xs)


def main(
    scenario: str = "tiny",
    rule: str = "[:-1]",
    steps: int = 3,
    repeats: int = 5,
    threads: int = 2,
    max_rows: int = 4096,
) -> None:
    torch.set_num_threads(threads)
    sc = scenarios.get(scenario)
    loaded = load_draft(sc.draft, target=sc.target)
    head = TargetHead.load(sc.target)
    parsed = parse_rule(rule)
    model = loaded.model
    draft_vocab = model.to_target_ids(torch.arange(loaded.config.draft_vocab_size))
    prepared = list(
        batches(
            DumpReader(sc.dump),
            parsed,
            head=head,
            draft_vocab=draft_vocab,
            steps=steps,
            max_rows=max_rows,
        )
    )

    def whole() -> None:
        evaluate(
            loaded, DumpReader(sc.dump), head=head, rule=parsed, steps=steps, max_rows=max_rows
        )

    @torch.inference_mode()
    def bare() -> None:
        for b in prepared:
            for h in model.ttt_forward(b.aux, b.tokens, steps=steps):
                model.logits(h).argmax(-1)

    whole()  # warm-up: file cache, allocator, kernels
    bare()
    times: dict[str, list[float]] = {"whole": [], "bare": []}
    for _ in range(repeats):  # interleaved so drift hits both alike
        for name, fn in (("whole", whole), ("bare", bare)):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    (w, w_mad), (b, b_mad) = _median_mad(times["whole"]), _median_mad(times["bare"])
    table = Table(title=f"standalone on {scenario}: rule {rule}, {steps} steps, {repeats} repeats")
    for col in ("measure", "median s", "MAD s"):
        table.add_column(col, justify="right")
    table.add_row("whole evaluation", f"{w:.3f}", f"{w_mad:.3f}")
    table.add_row("bare draft forwards", f"{b:.3f}", f"{b_mad:.3f}")
    table.add_row("ratio whole / bare", f"{w / b:.3f}", "")
    Console(stderr=True).print(table)
    print(
        json.dumps(
            {
                "overhead_ratio": round(w / b, 3),
                "whole_s": round(w, 4),
                "bare_s": round(b, 4),
                "repeats": repeats,
                "rows": sum(int(x.valid.sum()) for x in prepared),
            }
        )
    )


if __name__ == "__main__":
    typer.run(main)
