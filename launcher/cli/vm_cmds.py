"""`launcher vm up | ls | down`: Azure VMs that launcher creates, reaches by name and deletes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table
from rich.text import Text

from launcher.cli.common import command, options, render, reporter, stdout
from launcher.errors import UsageError
from launcher.result import D, Result

if TYPE_CHECKING:
    from launcher.vms.lifecycle import UpRecord
from launcher.vms import vmspec

app = typer.Typer(
    name="vm",
    help="Azure VMs that launcher creates, reaches as `--host NAME` and deletes "
    "(needs pip install 'launcher\\[azure]').",
    no_args_is_help=True,
)

SubscriptionOpt = Annotated[str | None, typer.Option(
    "--subscription", metavar="ID", help=f"Azure subscription ID (default: ${vmspec.SUBSCRIPTION_ENV}).")]


def _age(seconds: int | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"
    return f"{seconds // 86400}d{(seconds % 86400) // 3600}h"


def _print_up(result: Result[UpRecord]) -> None:
    d = result.data
    sub = d["subscription"] or f"(not given yet: --subscription or ${vmspec.SUBSCRIPTION_ENV})"
    stdout.print(Text(f"{'would create' if d['dry_run'] else 'created'} in subscription {sub}:"))
    for i, step in enumerate(d["plan"], 1):
        stdout.print(Text(f"  {i}. {step['kind']} {step['name']}: {step['detail']}"))
    if not d["dry_run"]:
        stdout.print(Text(f"host key {d['host_key_fingerprint']}, made by launcher, in {d['known_hosts']}"))
        stdout.print(Text(f"alias {d['name']} in {d['ssh_config']}: `launcher provision --host {d['name']}`, "
                          f"`launcher run RECIPE --host {d['name']}`; `launcher vm down {d['name']}` deletes it all"))
    stdout.print(Text(result.summary))


@command(app, "up")
def up_cmd(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The VM's name: its SSH alias (`--host NAME`) and resource group "
                                             "launcher-vm-NAME.")],
    size: Annotated[str, typer.Option("--size", metavar="SIZE", help="Azure VM size, e.g. Standard_NC4as_T4_v3 "
                                      "(GPU) or Standard_D4s_v5.")],
    region: Annotated[str, typer.Option("--region", metavar="REGION", help="Azure region, e.g. westeurope.")],
    image: Annotated[str, typer.Option(
        "--image", metavar="URN", help="Image PUBLISHER:OFFER:SKU:VERSION. The default, Ubuntu HPC, has the "
        "NVIDIA driver, Docker and the NVIDIA Container Toolkit; cloud-init adds Docker where an image lacks it.")]
    = vmspec.DEFAULT_IMAGE,
    spot: Annotated[bool, typer.Option("--spot", help="A Spot VM: much cheaper, may be evicted (deallocated).")]
    = False,
    auto_shutdown: Annotated[str, typer.Option(
        "--auto-shutdown", metavar="DURATION", help="Stop the VM this long from now and at that time every day "
        "(Azure's daily shutdown schedule, UTC): 8h, 90m, 1h30m; off for none.")] = vmspec.DEFAULT_AUTO_SHUTDOWN,
    ssh_from: Annotated[str | None, typer.Option(
        "--ssh-from", metavar="CIDR", help="Who may connect over SSH (default: this machine's public address, "
        "asked of https://api.ipify.org).")] = None,
    ssh_key: Annotated[Path | None, typer.Option(
        "--ssh-key", metavar="FILE", help="Your SSH public key (default: ~/.ssh/id_ed25519.pub, then id_rsa.pub); "
        "the private key beside it logs in.")] = None,
    user: Annotated[str, typer.Option("--user", metavar="NAME", help="The VM's admin user.")] = vmspec.DEFAULT_USER,
    subscription: SubscriptionOpt = None,
    no_wait: Annotated[bool, typer.Option("--no-wait", help="Return once Azure has made the VM, without waiting "
                                          "for SSH and its first-boot setup.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print what would be created; create nothing.")]
    = False,
) -> None:
    """Create an Azure VM for runs: its own resource group, SSH only from you, your key, no password login.

    Then `--host NAME` reaches it: an alias in ~/.launcher/ssh/config, its host key made by launcher.

    A failure half-way deletes what was made and says which limit was hit.

    Credentials: Azure's usual chain (AZURE_CLIENT_ID/_TENANT_ID/_CLIENT_SECRET, az login, managed identity).
    """
    from launcher.vms import lifecycle

    spec = vmspec.make_spec(name, size=size, region=region, image=image, spot=spot, auto_shutdown=auto_shutdown,
                            ssh_from=ssh_from, ssh_key=ssh_key, user=user, subscription=subscription)
    with reporter(ctx) as rep:
        res = lifecycle.up(spec, dry_run=dry_run, wait_ssh_s=0 if no_wait else lifecycle.SSH_WAIT_S, reporter=rep)
    if dry_run:
        summary = f"dry run: nothing created; `launcher vm up {name} ...` without --dry-run creates these"
    else:
        vm = res.vm
        ready = "ready" if res.ready else "made (not waited for)"
        summary = f"VM {name} {ready}: {spec.admin_user}@{vm.address if vm else '?'} ({spec.size}, {spec.region})"
    render(ctx, Result("vm up", res.to_dict(), summary=summary), _print_up)


@command(app, "ls")
def ls_cmd(ctx: typer.Context, subscription: SubscriptionOpt = None) -> None:
    """List every VM launcher made in the subscription: state, size, region, address, age."""
    from launcher.vms import lifecycle

    rows = lifecycle.ls(vmspec.subscription_of(subscription))

    def text(result: Result[D]) -> None:  # the summary and the rows
        if not rows:
            stdout.print(Text(result.summary))
            return
        table = Table("name", "state", "size", "region", "address", "age", "alias", box=None)
        for r in rows:
            table.add_row(Text(r["name"]), r["state"], r["size"] or "-", r["region"], r["address"] or "-",
                          _age(r["age_s"]), "yes" if r["alias"] else "no")
        stdout.print(table)

    summary = (f"{len(rows)} launcher VM{'s' if len(rows) != 1 else ''}" if rows
               else "no launcher VMs in this subscription")
    render(ctx, Result("vm ls", {"vms": rows}, summary=summary), text)


@command(app, "down")
def down_cmd(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The VM's name (as `launcher vm ls` shows it).")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask before deleting.")] = False,
    subscription: SubscriptionOpt = None,
) -> None:
    """Delete a VM launcher made: its resource group and all in it (waited for), then its alias and host key."""
    from launcher.vms import lifecycle

    vmspec.check_name(name)
    if not yes:
        if options(ctx).json or not sys.stdin.isatty():
            raise UsageError(f"`vm down {name}` deletes resource group {vmspec.group_name(name)} and all in it",
                             "add --yes to confirm")
        typer.confirm(f"Delete VM {name} and everything in resource group {vmspec.group_name(name)}?", abort=True)
    with reporter(ctx) as rep:
        res = lifecycle.down(name, vmspec.subscription_of(subscription), reporter=rep)
    summary = f"VM {name} deleted (resource group {res.group})" + (
        "; its alias and host key removed" if res.alias_removed else "")
    render(ctx, Result("vm down", {"name": name, "group": res.group, "alias_removed": res.alias_removed},
                       summary=summary))
