"""A project image shipped to an SSH host that has the variant's image: the project layer travels alone,
from the layer cache, and the project's package imports there."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from testhost import TestHost

from launcher.hosts.engine import Engine
from launcher.hosts.ssh import SSHHost
from launcher.images import build
from launcher.runs import project
from launcher.specs.recipes import load_recipe
from launcher.specs.request import RunRequest
from launcher.transfers import ship
from launcher.workspace import Workspace

pytestmark = [pytest.mark.testhost, pytest.mark.docker, pytest.mark.network]


@pytest.fixture
def remote(testhost: TestHost) -> Iterator[SSHHost]:
    with SSHHost.connect(testhost.spec, identity=testhost.key, known_hosts=testhost.known_hosts,
                         ssh_config=Path("/dev/null")) as h:
        yield h


def test_the_project_layer_ships_alone_to_a_host_that_has_the_variants_image(
        remote: SSHHost, testhost: TestHost, make_workspace: Callable[..., Workspace],
        six_lock: Callable[[Workspace], Workspace], tmp_path: Path) -> None:
    ws = six_lock(Workspace.at(make_workspace(tmp_path / "ws", recipes=False).root, tmp_path / "cache"))
    variant = build.build(ws, "cpu")
    first = ship.ship_image(remote, variant.tag, cache_dir=ws.cache_dir)
    assert not first.skipped

    proj = tmp_path / "myproj"
    proj.mkdir()
    (proj / "train.py").write_text("import tabulate\n")
    (proj / "requirements.in").write_text("tabulate\n")
    request = RunRequest(recipe=str(proj / "train.py"), variant="cpu")
    image = project.prepare(ws, request, load_recipe(ws, request.recipe))
    assert image is not None and image["project"]["variant_image_id"] == variant.image_id
    sent = ship.ship_image(remote, image["id"], tag="launcher-test/project:one", cache_dir=ws.cache_dir)
    n_layers = len(Engine(remote).inspect_image(image["id"])["RootFS"]["Layers"])
    assert (sent.layers_sent, sent.layers_skipped) == (1, n_layers - 1)
    assert sent.bytes_sent < 1 << 20  # tabulate and its lock, not the image
    out = testhost.exec("docker", "run", "--rm", "--network", "none", "launcher-test/project:one", "python", "-c",
                        "import tabulate, sys; print(tabulate.__file__, sys.flags.dont_write_bytecode)")
    assert "/opt/launcher/project/site-packages/tabulate/__init__.py" in out
