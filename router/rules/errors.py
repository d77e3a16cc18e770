"""Why a rule file was refused: one message that names the line and the field."""

from __future__ import annotations

__all__ = ["RulesInvalid"]


class RulesInvalid(ValueError):
    """A rule file that cannot run. ``line`` is 1-based (``None`` when unknown), ``path`` the
    field, e.g. ``rules[2].when.prompt_tokens.gt``."""

    def __init__(self, message: str, *, line: int | None = None, path: str = "") -> None:
        where = f"line {line}: " if line is not None else ""
        field = f"{path}: " if path else ""
        super().__init__(f"{where}{field}{message}")
        self.message = message
        self.line = line
        self.path = path

    def to_dict(self) -> dict[str, object]:
        return {"message": str(self), "line": self.line, "path": self.path}
