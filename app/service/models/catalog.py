"""What a model name means on this server: its aliases (OpenAI's names mean the default), the one
id of a model named several ways, the complete folders built here, and the names that can be
fetched (the catalog, Hugging Face repository ids). Read by the manager; holds no state but the
folder it lists."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from app.service.models.opening import ModelLoadError, list_model_folders
from app.service.models.options import ModelNames


@dataclass(frozen=True)
class ModelCatalog:
    models_dir: Path
    default_model: str
    names: ModelNames = field(default_factory=ModelNames)
    aliases: Mapping[str, str] = field(default_factory=dict)  # request name -> model id

    def resolve(self, name: str | None) -> str:
        """The model id a request's name means ("" / None / OpenAI's names = the default)."""
        key = (name or "").strip() or self.default_model
        return self.names.canonical(self.aliases.get(key, key))

    def listing(self) -> dict[str, Path]:
        """Model id -> folder of every complete model folder."""
        return {self.names.model_id(f): p for f, p in list_model_folders(self.models_dir).items()}

    def listed(self, key: str, listing: Mapping[str, Path]) -> bool:
        """Built here, or a catalog name or alias."""
        return key in listing or key in self.names.known

    def fetchable(self, key: str) -> bool:
        return self.names.fetchable(key)

    def check(self, names: Sequence[str]) -> None:
        """Raise `ModelLoadError` unless every name is built, in the catalog or a repo id."""
        listing = self.listing()
        unknown = [n for n in names if not (self.listed(n, listing) or self.fetchable(n))]
        if unknown:
            raise ModelLoadError(
                f"model(s) {', '.join(unknown)} not found in {self.models_dir.resolve()} "
                f"(complete model folders there: {', '.join(listing) or 'none'}) and not a "
                f"catalog name, alias or Hugging Face repository id; build one with "
                f"`make models MODEL=<name>` or change STT_MODELS"
            )
