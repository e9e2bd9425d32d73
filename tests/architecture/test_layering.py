"""Imports only go down: each room of router/ may import only the rooms below it.

The rooms and their order are ARCHITECTURE.md's. The check reads every import statement
(including those only made for type checking, and those inside functions), so a lower
room that reaches up, even lazily, fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# top to bottom; a module may import its own room and any room after it
ROOMS = ("entry", "epp", "server", "admission", "precise", "routing", "residency", "fleet",
         "infra", "config", "protocol", "client")
ENTRY = {"router", "router.cli", "router.demo", "router.__main__"}
NO_IO_ROOMS = {"routing": ("aiohttp", "redis"),  # decisions stay pure: no HTTP, no Redis
               "admission": ("aiohttp",)}  # the HTTP half is server/admission_edge.py


def room_of(module: str) -> str | None:
    if module in ENTRY:
        return "entry"
    parts = module.split(".")
    if parts[0] != "router" or len(parts) < 2:
        return None
    if parts[1] == "config":
        return "config"
    return parts[1] if parts[1] in ROOMS else None


def module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
            found += [f"{node.module}.{a.name}" for a in node.names]  # from router import x
    return found


def router_modules() -> list[Path]:
    return sorted(p for p in (REPO / "router").rglob("*.py"))


def test_every_router_module_is_in_a_room() -> None:
    homeless = [module_name(p) for p in router_modules() if room_of(module_name(p)) is None]
    assert not homeless, f"modules outside every room (add them to ARCHITECTURE.md): {homeless}"


@pytest.mark.parametrize("path", router_modules(), ids=lambda p: module_name(p))
def test_imports_only_go_down(path: Path) -> None:
    here = room_of(module_name(path))
    assert here is not None
    rank = ROOMS.index(here)
    upward = []
    for target in imports(path):
        there = room_of(target)
        if there is not None and ROOMS.index(there) < rank:
            upward.append(f"{target} ({there})")
        for banned in NO_IO_ROOMS.get(here, ()):
            if target == banned or target.startswith(banned + "."):
                upward.append(f"{target} (I/O in {here})")
    assert not upward, f"{module_name(path)} ({here}) imports upward: {sorted(set(upward))}"


@pytest.mark.parametrize("path", sorted((REPO / "engine_worker").rglob("*.py")),
                         ids=lambda p: module_name(p))
def test_workers_share_only_the_protocol_and_infra_with_the_router(path: Path) -> None:
    """engine_worker runs beside vLLM: it must not pull in the gateway."""
    allowed = {"protocol", "infra", "client", "config"}
    wrong = [t for t in imports(path) if (room := room_of(t)) is not None and room not in allowed]
    assert not wrong, f"{module_name(path)} imports router internals: {wrong}"


def test_the_sdk_imports_nothing_of_the_server() -> None:
    for path in (REPO / "router" / "client").rglob("*.py"):
        wrong = [t for t in imports(path) if t.startswith("router.")
                 and not t.startswith("router.client")]
        assert not wrong, f"{module_name(path)}: {wrong}"
