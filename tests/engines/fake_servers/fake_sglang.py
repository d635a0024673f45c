"""A scripted SGLang stand-in for the engine's fault tests: serve's launch flags and HTTP front,
canned answers.

Run as a script (the engine's launch command is ``[python, this file]``). ``FAKE_SGLANG_FAULT`` (set
by the trial's ``settings.env``) picks the behaviour:

- unset: healthy; every request answers ``max_new_tokens`` tokens, two per verify step (accept
  length 2);
- ``oom``: prints a CUDA out-of-memory traceback and exits 1 before ready;
- ``capture``: prints SGLang's "captured 2 of 3 aux hidden states" error and exits 1 before ready;
- ``never_ready``: /health_generate answers 503 forever;
- ``dies``: exits (code 3) on the first request after /flush_cache, i.e. during the benchmark;
- ``hangs``: never answers a request after /flush_cache;
- ``ignores_sigterm``: healthy, but it and its child ignore SIGTERM.

Like SGLang it starts a child process (its "scheduler"), so teardown must take down the whole group.
Argument errors come from argparse itself: ``--mem-fraction-static`` must be a float.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

from bisect_eagle.engines import serve

FAULT = os.environ.get("FAKE_SGLANG_FAULT", "")
CHILD = "import signal, time\n{}\ntime.sleep(3600)"


class Scripted(serve.Backend):
    """Canned answers: two tokens per verify step; faults after the cache flush that ends
    warm-up."""

    def __init__(self, info: dict):
        super().__init__(info)
        self.flushed = False

    def health(self) -> bool:
        return FAULT != "never_ready"

    def flush_cache(self) -> bool:
        ok = super().flush_cache()
        self.flushed = self.flushed or ok
        if ok:
            print("fake sglang: cache flushed", flush=True)
        return ok

    def decode(self, req: serve.GenerateRequest) -> dict:
        if self.flushed and FAULT == "dies":
            print("Fatal Python error: Segmentation fault (scripted)", flush=True)
            os._exit(3)
        if self.flushed and FAULT == "hangs":
            time.sleep(3600)
        n = req.max_new_tokens
        steps = (n + 1) // 2
        meta = {
            "id": req.rid,
            "prompt_tokens": len(req.input_ids or []),
            "completion_tokens": n,
            "spec_verify_ct": steps,
            "spec_accept_length": n / steps,
            "spec_correct_drafts_histogram": [n % 2, n // 2],
        }
        return {"text": "x" * n, "output_ids": [7] * n, "meta_info": meta}


def main() -> None:
    parser = serve.build_parser(prog="fake_sglang.py")
    parser.add_argument("--mem-fraction-static", type=float, default=0.9)
    parser.add_argument("--cuda-graph-max-bs-decode", type=int, default=None)
    parser.add_argument("--disable-custom-all-reduce", action="store_true")
    a = parser.parse_args()
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(levelname)s %(message)s")
    print(f"fake sglang: fault={FAULT or 'none'} argv={sys.argv[1:]}", flush=True)
    if FAULT == "oom":
        print(
            'Traceback (most recent call last):\n  File "model_runner.py", line 1, in '
            "load_model\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            flush=True,
        )
        sys.exit(1)
    if FAULT == "capture":
        print("RuntimeError: captured 2 of 3 aux hidden states", flush=True)
        sys.exit(1)
    ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN)" if FAULT == "ignores_sigterm" else ""
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(ignore)])
    info = {
        "speculative_algorithm": a.speculative_algorithm,
        "speculative_num_steps": a.speculative_num_steps,
        "speculative_eagle_topk": a.speculative_eagle_topk,
        "speculative_num_draft_tokens": a.speculative_num_draft_tokens,
        "max_running_requests": 8,
        "mem_fraction_static": a.mem_fraction_static,
        "disable_custom_all_reduce": a.disable_custom_all_reduce,
        "cuda_graph_max_bs_decode": a.cuda_graph_max_bs_decode,
        "api_key": "s3cret",
        "tp_size": a.tp_size,
    }
    httpd = serve.ServeHTTPServer((a.host, a.port), Scripted(info))
    if FAULT == "ignores_sigterm":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print(serve.READY_LINE, flush=True)
        httpd.serve_forever(poll_interval=0.1)
    serve.serve_until_signal(httpd)
    child.terminate()
    child.wait()


if __name__ == "__main__":
    main()
