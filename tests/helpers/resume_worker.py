"""The fresh-process half of test_resume_exact.py: restore every saved loader state, run each
to the end, and save the batches. Usage: python resume_worker.py CASES.pt OUT.pt"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.helpers.resume_cases import make_loader, run_rest  # noqa: E402


def main(cases_file: str, out_file: str) -> None:
    saved = torch.load(cases_file, weights_only=False)
    results = []
    for case, state, epoch in saved["cases"]:
        loader = make_loader(saved["paths"], case)
        loader.load_state_dict(state)
        results.append(run_rest(loader, case, epoch))
    torch.save(results, out_file)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
