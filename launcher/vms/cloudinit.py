"""The VM's first boot: a host key launcher makes and hands over through cloud-init, so the key is
known before the first connection (never trust-on-first-use), and the setup for what the image lacks."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from importlib import resources

READY_MARKER = "/var/lib/launcher/vm-ready"  # written last by setup.sh
SETUP_PATH = "/etc/launcher/vm-setup.sh"


@dataclass(frozen=True)
class HostKey:
    """An ed25519 host key: the private half goes to the VM only, the public half to known_hosts."""

    private_openssh: str
    public: str  # "ssh-ed25519 AAAA..."

    @classmethod
    def generate(cls) -> HostKey:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        key = Ed25519PrivateKey.generate()
        private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                    serialization.NoEncryption()).decode()
        public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                               serialization.PublicFormat.OpenSSH).decode()
        return cls(private_openssh=private, public=public)

    @property
    def fingerprint(self) -> str:
        import hashlib

        blob = base64.b64decode(self.public.split()[1])
        return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def setup_script() -> str:
    return resources.files("launcher.vms").joinpath("setup.sh").read_text(encoding="utf-8")


def user_data(admin_user: str, host_key: HostKey) -> str:
    """The cloud-config (JSON, which cloud-init reads as YAML): only launcher's host key (the image's
    own are deleted and none generated), no password login, and setup.sh run once."""
    config = {
        "ssh_deletekeys": True,
        "ssh_genkeytypes": [],
        "ssh_keys": {"ed25519_private": host_key.private_openssh, "ed25519_public": host_key.public},
        "ssh_pwauth": False,
        "disable_root": True,
        "write_files": [{"path": SETUP_PATH, "permissions": "0755", "owner": "root:root",
                         "content": setup_script()}],
        "runcmd": [["sh", SETUP_PATH, admin_user]],
    }
    return "#cloud-config\n" + json.dumps(config, indent=1, sort_keys=True) + "\n"


def custom_data(admin_user: str, host_key: HostKey) -> str:
    """user_data as Azure's osProfile.customData wants it: base64."""
    return base64.b64encode(user_data(admin_user, host_key).encode()).decode()
