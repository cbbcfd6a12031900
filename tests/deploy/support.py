"""Reading the deployable artifacts under test: the Dockerfile's instructions, the config files' secrets."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
ENV_SPEC = re.compile(r"^os\.environ/([A-Za-z_][A-Za-z0-9_]*)$")


@dataclass
class Instruction:
    keyword: str
    flags: dict[str, str]
    args: str

    def exec_form(self) -> list[str]:
        """The JSON array of ENTRYPOINT, CMD or HEALTHCHECK ... CMD; ``ValueError`` for the shell form."""
        text = self.args.removeprefix("CMD").strip() if self.keyword == "HEALTHCHECK" else self.args
        value = json.loads(text)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{self.keyword} is not in exec form: {self.args}")
        return value


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction:
        found = self.all(keyword)
        assert found, f"stage {self.name or self.base} has no {keyword}"
        return found[-1]


def dockerfile_stages(path: Path) -> list[Stage]:
    """The Dockerfile's stages in order, continuation lines joined and comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        flags: dict[str, str] = {}
        rest = rest.strip()
        while rest.startswith("--"):
            flag, _, rest = rest.partition(" ")
            name, _, value = flag[2:].partition("=")
            flags[name] = value
            rest = rest.strip()
        if keyword == "FROM":
            words = rest.split()
            stages.append(Stage(base=words[0], name=words[2] if len(words) == 3 and words[1].upper() == "AS" else None))
            continue
        assert stages, f"{keyword} before any FROM"
        stages[-1].instructions.append(Instruction(keyword, flags, rest))
    return stages


def copy_sources(instruction: Instruction) -> list[str]:
    """The build-context paths a COPY or ADD takes (all its words but the destination)."""
    text = instruction.args
    words = json.loads(text) if text.startswith("[") else shlex.split(text)
    return words[:-1]


def env_names(value: Any) -> set[str]:
    """Every ``os.environ/NAME`` a parsed config names, anywhere in it."""
    if isinstance(value, dict):
        return set().union(*(env_names(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(env_names(v) for v in value)) if value else set()
    if isinstance(value, str) and (match := ENV_SPEC.match(value)):
        return {match.group(1)}
    return set()
