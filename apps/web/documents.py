"""The documents routes: upload files (``POST /api/documents``), index a server folder
(``POST /api/folder``), follow the indexing (``GET /api/progress``) and forget them
(``DELETE /api/documents``). See ``apps.web.server`` for the endpoints' contract."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request, UploadFile
from pydantic import BaseModel, Field

from apps.web.state import WebState, web_state

MAX_NAME_CHARS = 120
MAX_NAME_BYTES = 200
"""An upload's saved name in UTF-8 stays under this, leaving room for `` (N)`` within the 255 bytes
file systems allow (130 mathematical letters are 520 bytes)."""
MAX_SUFFIX_CHARS = 16
MAX_FOLDER_CHARS = 4096

router = APIRouter()


class FolderBody(BaseModel):
    path: str = Field(min_length=1, max_length=MAX_FOLDER_CHARS)


@router.post("/api/documents")
async def upload(
    request: Request, files: list[UploadFile], progress: str = "", web: WebState = Depends(web_state)
) -> dict[str, Any]:
    config = web.config
    if not files:
        raise HTTPException(400, "no files in the upload (field 'files')")
    if len(files) > config.max_files:
        raise HTTPException(413, f"too many files: at most {config.max_files} per upload")
    for upload_file in files:
        suffix = Path(upload_file.filename or "").suffix.lower()
        if suffix not in config.allowed_suffixes:
            raise HTTPException(
                415, f"{upload_file.filename!r}: unsupported file type; upload {', '.join(config.allowed_suffixes)}"
            )
        if upload_file.size is not None and upload_file.size > config.max_file_bytes:
            raise HTTPException(413, f"{upload_file.filename!r} is larger than {_mib(config.max_file_bytes)}")
    session, notices = web.session_for_change(request)
    async with web.store.changing(session), web.dropped_if_unused(request, session):
        incoming = sum(f.size or 0 for f in files)  # the multipart parser counts every file's bytes
        if _folder_bytes(session.uploads) + incoming > config.max_session_bytes:
            raise HTTPException(
                413, f"this session's uploads would pass {_mib(config.max_session_bytes)}: clear the documents first"
            )
        session.uploads.mkdir(parents=True, exist_ok=True)
        written: list[Path] = []
        try:
            for upload_file in files:
                filename = upload_file.filename or "upload"
                data = await upload_file.read(config.max_file_bytes + 1)
                if len(data) > config.max_file_bytes:
                    raise HTTPException(413, f"{filename!r} is larger than {_mib(config.max_file_bytes)}")
                safe = _safe_name(filename)
                target = _free_name(session.uploads, safe)
                shown = Path(filename.replace("\\", "/")).name
                if target.name != shown:
                    notices.append(f"{shown!r} was saved as {target.name!r}: {_rename_reason(shown, target.name, safe)}")
                target.write_bytes(data)
                written.append(target)
            await web.reindex(session, [session.uploads], progress, added=written)
        except BaseException:  # the index is unchanged: so are the session's files
            for path in written:
                path.unlink(missing_ok=True)
            raise
        return web.describe(session, notices)


@router.post("/api/folder")
async def add_folder(
    request: Request, body: FolderBody, progress: str = "", web: WebState = Depends(web_state)
) -> dict[str, Any]:
    config = web.config
    if not config.allow_folders:
        raise HTTPException(403, "indexing server folders is disabled; upload the files instead")
    try:
        folder = Path(body.path).expanduser()
        found = folder.is_dir()
    except RuntimeError:  # ~name of a user that does not exist
        raise HTTPException(404, f"no such folder on the server: {body.path[:200]!r} (no such user)") from None
    except (OSError, ValueError) as e:  # a name too long, a NUL byte
        raise HTTPException(422, f"not a usable folder path: {body.path[:200]!r} ({e.strerror or e})") from None
    if not found:
        raise HTTPException(404, f"no such folder on the server: {body.path[:200]!r}")
    session, notices = web.session_for_change(request)
    async with web.store.changing(session), web.dropped_if_unused(request, session):
        paths = [folder, session.uploads] if session.uploads.is_dir() else [folder]
        await web.reindex(session, paths, progress)
        return web.describe(session, notices)


@router.get("/api/progress")
async def get_progress(id: str = "", web: WebState = Depends(web_state)) -> dict[str, Any]:  # noqa: A002 - the query parameter's name
    return web.progress.get(id)


@router.delete("/api/documents")
async def reset(request: Request, web: WebState = Depends(web_state)) -> dict[str, Any]:
    session = web.live_session(request)
    if session is not None:
        async with web.store.changing(session):
            await asyncio.to_thread(web.store.reset, session)
    return web.describe(session)


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) if folder.is_dir() else 0


def _free_name(folder: Path, name: str) -> Path:
    """``folder / name``, or ``name (2)``, ``name (3)``... when that is taken."""
    target = folder / name
    stem, suffix = Path(name).stem, Path(name).suffix
    n = 2
    while target.exists():
        target = folder / f"{stem} ({n}){suffix}"
        n += 1
    return target


def _safe_name(filename: str) -> str:
    """A file name without folders or odd characters (the upload's own path is never trusted).

    The suffix is kept (lower case), so the file is still indexed by its type: ``..txt`` becomes
    ``upload.txt``, not ``txt``.
    """
    name = Path(filename.replace("\\", "/")).name
    stem, dot, suffix = name.rpartition(".")
    if not dot:
        stem, suffix = name, ""

    def clean(part: str) -> str:
        return "".join(c if c.isalnum() or c in "-_. ()" else "_" for c in part).strip(" .")

    suffix = clean(suffix).lower()[:MAX_SUFFIX_CHARS]
    room = MAX_NAME_BYTES - len(suffix.encode()) - 1
    stem = clean(stem)[:MAX_NAME_CHARS].encode()[:room].decode(errors="ignore").strip(" .") or "upload"
    return f"{stem}.{suffix}" if suffix else stem


def _rename_reason(shown: str, saved: str, safe: str) -> str:
    """Why an upload called ``shown`` was saved as ``saved`` (``safe``: its cleaned name)."""
    if saved != safe:
        return "a file of that name is already uploaded"
    if shown.lower() == safe.lower():
        return "its suffix is kept in lower case"
    if len(shown.encode()) > MAX_NAME_BYTES or len(shown) > MAX_NAME_CHARS:
        return "its name was too long to keep whole"
    return "its name had characters a file name cannot keep"


def _mib(n: int) -> str:
    return f"{n / 2**20:g} MiB"
