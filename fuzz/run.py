"""Run one fuzz target under atheris (libFuzzer) for a bounded time: `python -m fuzz.run TARGET --seconds N`.

The corpus starts from the seeds (fuzz/seeds.py) in `--corpus-dir/TARGET` and grows there between runs; a crash is
written to `--corpus-dir/crash-TARGET-*` and fails the run (exit code 1). The last line is libFuzzer's
`Done N runs in S second(s)`: the execution count to report.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["epp"]):
    from fuzz import targets

from fuzz.seeds import SEEDS


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target", choices=sorted(targets.TARGETS))
    ap.add_argument("--seconds", type=int, default=600)
    ap.add_argument("--corpus-dir", default=".fuzz")
    ap.add_argument("--rss-limit-mb", type=int, default=3072)
    ns, rest = ap.parse_known_args(argv)
    corpus = Path(ns.corpus_dir) / ns.target
    corpus.mkdir(parents=True, exist_ok=True)
    for seed in SEEDS[ns.target]():
        (corpus / hashlib.sha1(seed).hexdigest()).write_bytes(seed)
    args = [
        sys.argv[0],
        f"-max_total_time={ns.seconds}",
        "-timeout=20",
        f"-rss_limit_mb={ns.rss_limit_mb}",
        "-max_len=65536",
        "-print_final_stats=1",
        f"-artifact_prefix={Path(ns.corpus_dir) / f'crash-{ns.target}-'}",
        *rest,
        str(corpus),
    ]
    atheris.Setup(args, targets.TARGETS[ns.target])
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main())
