"""Third-party backends are found through entry points, with no change to hami.

``tests/plugin_example`` is a separate distribution; a copy is installed with pip into a
temporary directory (about 2 s) that is then put on ``sys.path``, the way a site-packages
directory is. Broken plug-ins are written as bare ``*.dist-info`` directories.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hami.backends import AllocationRequest, Backend, BackendError, registry
from hami.protocol import ContainerDevice, encode_node_devices

EXAMPLE = Path(__file__).parent / "plugin_example"
EXAMPLE_ENTRY_POINT = "example = hami_example_backend:ExampleBackend"


@pytest.fixture(scope="module")
def installed_example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("plugin")
    target = work / "site"
    if importlib.util.find_spec("setuptools") is None:
        # No offline build backend (Python >= 3.12 venvs lack setuptools): lay out what
        # pip would install, from the same pyproject entry point.
        shutil.copytree(EXAMPLE / "src" / "hami_example_backend", target / "hami_example_backend")
        add_distribution(target, "hami_example_backend", EXAMPLE_ENTRY_POINT, {})
        return target
    source = work / "src"
    shutil.copytree(EXAMPLE, source)  # builds write into the source tree: use a copy
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"]
    subprocess.run(
        [*pip, "--no-build-isolation", "--target", str(target), str(source)],
        check=True,
        timeout=120,
    )
    return target


@pytest.fixture
def example_on_path(installed_example: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(installed_example))
    monkeypatch.delitem(sys.modules, "hami_example_backend", raising=False)
    return installed_example


def add_distribution(site: Path, name: str, entry_points: str, modules: dict[str, str]) -> None:
    """A minimal installed distribution: METADATA, entry_points.txt and its modules."""
    info = site / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[hami.backends]\n{entry_points}\n")
    for module, code in modules.items():
        (site / f"{module}.py").write_text(textwrap.dedent(code))


def test_not_installed_not_found() -> None:
    assert "example" not in registry.available()


async def test_separately_installed_backend_is_discovered_and_used(example_on_path: Path) -> None:
    found = registry.available()
    assert f"example = {found['example'].value}" == EXAMPLE_ENTRY_POINT
    assert {"nvidia", "mlu", "fake"} <= set(found)

    backend = registry.create("example")
    assert isinstance(backend, Backend)
    module = sys.modules[type(backend).__module__]
    assert Path(module.__file__ or "").is_relative_to(example_on_path)  # not from hami

    assert backend.register_key == "hami.io/node-xpu-register"
    devices = await backend.enumerate()
    assert encode_node_devices(backend.to_node_devices(devices)) == (
        "XPU-example-0,10,16384,0,XPU-Example-16G,0,true:"
        "XPU-example-1,10,16384,0,XPU-Example-16G,0,true:"
    )
    answer = backend.allocate(
        AllocationRequest(
            pod_namespace="default",
            pod_name="p",
            pod_uid="u",
            container_name="c",
            container_index=0,
            devices=[ContainerDevice("XPU-example-1", "XPU", 16384, 0)],
            node_devices=devices,
        )
    )
    assert answer.envs == {"XPU_VISIBLE_DEVICES": "1"}


def test_unknown_backend_lists_the_installed_ones() -> None:
    with pytest.raises(BackendError) as err:
        registry.create("nvdia")
    message = str(err.value)
    assert "unknown backend 'nvdia'" in message
    assert "Metax-GPU, Metax-SGPU, XPU, dcu, fake, kunlun, mlu, mthreads, nvidia" in message


def test_broken_plugins_are_errors_not_crashes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_distribution(
        tmp_path,
        "hami_broken_backends",
        "\n".join(
            [
                "broken = hami_broken_import:Backend",
                "missing = hami_no_such_module:Backend",
                "notabackend = hami_broken_other:NotABackend",
                "failing = hami_broken_other:FailingBackend",
            ]
        ),
        {
            "hami_broken_import": "import hami_vendor_sdk_that_is_not_installed\n",
            "hami_broken_other": """
                from hami.backends.fake import FakeBackend

                class NotABackend:
                    pass

                class FailingBackend(FakeBackend):
                    def __init__(self, settings=None):
                        raise RuntimeError("vendor SDK refused to start")
            """,
        },
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("hami_broken_import", "hami_broken_other"):
        monkeypatch.delitem(sys.modules, name, raising=False)

    assert {"broken", "missing", "notabackend", "failing"} <= set(registry.available())
    with pytest.raises(BackendError, match=r"'broken' .* failed to load: ModuleNotFoundError"):
        registry.create("broken")
    with pytest.raises(BackendError, match=r"'missing' .* failed to load"):
        registry.create("missing")
    with pytest.raises(BackendError, match=r"'notabackend' .* is not a subclass"):
        registry.create("notabackend")
    with pytest.raises(BackendError, match=r"'failing' could not start: .*vendor SDK refused"):
        registry.create("failing")
    # The built-in backends are unaffected by the broken neighbours.
    assert registry.create("fake").type_word == "nvidia"
