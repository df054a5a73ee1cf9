"""Shipping images that launcher built: after a rebuild whose recipe alone changed, only the
recipe layer travels, read from the build's layer cache (no `docker save`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from testhost import TestHost

from launcher.hosts import engine
from launcher.hosts.engine import Engine
from launcher.hosts.ssh import SSHHost
from launcher.images import build
from launcher.transfers import ship
from launcher.workspace import Workspace

pytestmark = [pytest.mark.testhost, pytest.mark.docker]


@pytest.fixture
def remote(testhost: TestHost) -> Iterator[SSHHost]:
    with SSHHost.connect(testhost.spec, identity=testhost.key, known_hosts=testhost.known_hosts,
                         ssh_config=Path("/dev/null")) as h:
        yield h


def test_rebuilt_recipe_layer_ships_alone_from_the_layer_cache(
    remote: SSHHost, testhost: TestHost, make_workspace: Callable[..., Workspace],
    six_lock: Callable[[Workspace], Workspace], tmp_path: Path
) -> None:
    ws = six_lock(Workspace.at(make_workspace(tmp_path / "ws", recipes=False).root, tmp_path / "cache"))
    (ws.recipes / "hello").mkdir()
    script = ws.recipes / "hello" / "train.py"
    script.write_text("print('one')\n")
    first = build.build(ws, "cpu")
    one = ship.ship_image(remote, first.tag, cache_dir=ws.cache_dir)
    assert not one.skipped and Engine(remote).has_image(first.image_id)

    script.write_text("print('two')\n")
    second = build.build(ws, "cpu")
    assert second.image_id != first.image_id
    two = ship.ship_image(remote, second.tag, tag="launcher-test/built:two", cache_dir=ws.cache_dir)
    n_layers = len(engine.local().inspect_image(second.tag)["RootFS"]["Layers"])
    assert (two.layers_sent, two.layers_skipped) == (1, n_layers - 1)
    assert two.bytes_sent < 64 * 1024
    assert Engine(remote).has_image(second.image_id)
    out = testhost.exec("docker", "run", "--rm", "launcher-test/built:two", "cat",
                        "/opt/launcher/recipes/hello/train.py")
    assert out.strip() == "print('two')"
