"""The repository stands alone (issue 19 item 1): a copy of it in a directory with nothing
beside it collects the whole suite and passes the tests that read the project's own vectors,
and no file of it points outside it (the contract, docs/protocol.md, and the test vectors,
tests/data, live in the repository).

The copy holds what a commit of the working tree would hold (tracked files and new files git
does not ignore), so a reference outside the repository fails here before it is committed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The tests that once read the companion folder beside the checkout, and the one whose
# Go-made vectors moved with them.
VECTOR_TESTS = [
    "tests/test_protocol_vectors.py",
    "tests/test_go_vectors.py",
    "tests/test_interop_short_values.py",
    "tests/test_webhook_go_parity.py",
]
# Written split so that this file does not name what it looks for.
OUTSIDE = ["../" + "shared", "HAMI_" + "SHARED_DIR"]
MARKDOWN_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def _files() -> list[str]:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the files of a commit are unknown")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return sorted({f for f in listed.split("\0") if f and (ROOT / f).is_file()})


def _text(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")


def test_no_file_points_outside_the_repository() -> None:
    # This checkout's own absolute path and its sibling folder; a short root such as /src is
    # left out, as it would match ordinary paths in the docs.
    outside = [*OUTSIDE, str(ROOT.parent / "shared")]
    if len(ROOT.parts) > 2:
        outside.append(str(ROOT))
    found = []
    for name in _files():
        text = _text(ROOT / name)
        found += [f"{name}: {needle}" for needle in outside if needle in text]
    assert not found, "files that reach outside the repository:\n" + "\n".join(found)


def test_every_relative_link_in_the_docs_opens_a_file_of_the_repository() -> None:
    broken = []
    for name in _files():
        if not name.endswith(".md"):
            continue
        for target in MARKDOWN_LINK.findall(_text(ROOT / name)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path = ((ROOT / name).parent / target).resolve()
            if not path.is_relative_to(ROOT) or not path.exists():
                broken.append(f"{name}: {target}")
    assert not broken, "links that do not open a file of the repository:\n" + "\n".join(broken)


def test_a_copy_with_nothing_beside_it_collects_the_suite_and_passes_the_vector_tests(
    tmp_path: Path,
) -> None:
    alone = tmp_path / "alone"
    copy = alone / "hami"
    for name in _files():
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, copy / name, follow_symlinks=False)
    assert [p.name for p in alone.iterdir()] == ["hami"]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", OUTSIDE[1])}
    # This venv's interpreter, importing hami from the copy (PYTHONPATH comes before the
    # editable install's finder).
    env["PYTHONPATH"] = str(copy)
    pytest_cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"]

    where = subprocess.run(
        [sys.executable, "-c", "import hami; print(hami.__file__)"],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(where.stdout.strip()).is_relative_to(copy)

    collected = subprocess.run(
        [*pytest_cmd, "--collect-only"], cwd=copy, env=env, capture_output=True, text=True
    )
    tail = (collected.stdout + collected.stderr)[-3000:]
    assert collected.returncode == 0, f"collection failed in a lone copy:\n{tail}"
    assert re.search(r"\d+ tests collected", tail), tail

    ran = subprocess.run(
        [*pytest_cmd, *VECTOR_TESTS], cwd=copy, env=env, capture_output=True, text=True
    )
    tail = (ran.stdout + ran.stderr)[-3000:]
    assert ran.returncode == 0, f"the vector tests failed in a lone copy:\n{tail}"
    assert " passed" in tail and " skipped" not in tail, tail
