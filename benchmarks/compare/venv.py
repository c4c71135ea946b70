"""The peers' virtual environment: WebDataset, MosaicML Streaming, LitData and megatron-core next to shardtok.

The peers' pins conflict with shardtok's own environment (mosaicml-streaming wants numpy < 2.2
and transformers < 5), so they live in `.bench/peers-venv`, never in shardtok's dependencies.
Every install is constrained to torch==2.13.0: an unconstrained resolve would replace the local
CPU build by gigabytes of CUDA wheels.

Two packages are installed without their declared dependencies, on purpose:
- mosaicml-streaming pulls five cloud SDKs and torchvision. On PyPI torchvision exists only as a
  CUDA build; its `_C` extension links libtorch_cuda and cannot load against CPU torch, so
  `import torchvision` fails. Only `streaming/__init__.py` imports torchvision (through
  `streaming.vision`); the MDS writer and StreamingDataset live in `streaming.base`, which
  `systems/mosaic_mds.py` imports without running the package `__init__`. The packages that
  `streaming.base` does import are listed below.
- litdata declares torchvision too but imports it only to decode images and video.
megatron-core is installed the same way so that nothing but the constrained first step ever
resolves torch.

The venv sees shardtok's own site-packages (``--system-site-packages``): torch (750 MB of the
1.4 GB a standalone venv took) and its dependencies are then the very build shardtok is measured
with, already installed, and only the peers and the two pins they need (numpy < 2.2,
transformers < 5) are downloaded into the venv, where they shadow the outer versions.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".bench" / "peers-venv"

SYSTEM_SITE_PACKAGES = True  # part of the recipe: a venv built without it is rebuilt
CONSTRAINTS = ("torch==2.13.0", "numpy<2.2", "transformers<5")

WITH_DEPENDENCIES = (
    "torch==2.13.0",
    "numpy<2.2",
    "webdataset==1.0.2",
    # what streaming.base imports (mosaicml-streaming itself goes in without dependencies)
    "transformers<5",
    "brotli",
    "python-snappy",
    "zstd",
    "xxhash",
    "catalogue",
    "tqdm",
    "typing_extensions",
    # litdata's declared dependencies minus torchvision
    "lightning-utilities",
    "filelock",
    "boto3",
    "requests",
    "urllib3>=1.26",
    "tifffile",
    "obstore",
    # megatron-core declares torch, numpy and packaging
    "packaging",
    # shardtok's light dependencies (shardtok goes in editable, without dependencies)
    "zstandard",
    "fsspec",
    "pyyaml",
    # the plots
    "matplotlib",
)

WITHOUT_DEPENDENCIES = (
    "mosaicml-streaming==0.13.0",
    "litdata==0.2.76",
    "megatron-core==0.16.1",
)

PEER_PACKAGES = (
    "torch",
    "numpy",
    "webdataset",
    "mosaicml-streaming",
    "litdata",
    "megatron-core",
    "transformers",
    "zstandard",
    "matplotlib",
)


def python() -> Path:
    return VENV / "bin" / "python"


def _recipe() -> str:
    text = json.dumps(
        [CONSTRAINTS, WITH_DEPENDENCIES, WITHOUT_DEPENDENCIES, str(REPO), SYSTEM_SITE_PACKAGES]
    )
    return hashlib.sha256(text.encode()).hexdigest()


def _marker() -> Path:
    return VENV / "shardtok-peers.json"


def is_ready() -> bool:
    try:
        return json.loads(_marker().read_text())["recipe"] == _recipe() and python().exists()
    except (OSError, ValueError, KeyError):
        return False


def _pip(*args: str) -> None:
    cmd = [str(python()), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(
            f"building {VENV} failed: {' '.join(cmd)}\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
        )


def ensure(log=print) -> Path:
    """Create or refresh the venv when its recipe changed; returns its python. Safe to race."""
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / "peers-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_ready():
            return python()
        start = time.perf_counter()
        log(f"building the peers' virtual environment in {VENV} (once; torch comes from outside)")
        create = [sys.executable, "-m", "venv", "--system-site-packages"]
        if VENV.exists():
            create.append("--clear")
        subprocess.run([*create, str(VENV)], check=True)
        constraints = VENV / "constraints.txt"
        constraints.write_text("\n".join(CONSTRAINTS) + "\n")
        # torch first, alone: the resolver then never looks at another torch build.
        _pip("-c", str(constraints), "torch==2.13.0")
        _pip("-c", str(constraints), *WITH_DEPENDENCIES)
        _pip("-c", str(constraints), "--no-deps", *WITHOUT_DEPENDENCIES, "-e", str(REPO))
        _marker().write_text(json.dumps({"recipe": _recipe()}))
        log(f"peers' environment ready in {time.perf_counter() - start:.0f} s")
        return python()


def versions() -> dict[str, str]:
    """Installed versions of the packages the results depend on (read from the venv's metadata)."""
    code = (
        "import json, importlib.metadata as m\n"
        f"names = {list(PEER_PACKAGES)!r} + ['shardtok']\n"
        "out = {}\n"
        "for n in names:\n"
        "    try: out[n] = m.version(n)\n"
        "    except m.PackageNotFoundError: out[n] = 'missing'\n"
        "print(json.dumps(out))\n"
    )
    result = subprocess.run([str(python()), "-c", code], capture_output=True, text=True, check=True)
    return json.loads(result.stdout)
