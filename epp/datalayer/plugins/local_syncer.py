"""local-syncer (llm-d's in-memory cross-replica syncer for one replica and tests): accepted so llm-d configs that
name it load. It syncs nothing: every contributor keeps its own replica's values (its remote part stays 0)."""

from __future__ import annotations

from collections.abc import Sequence

from epp.framework import CrossReplicaContributor, Plugin


class LocalSyncer(Plugin):
    type_name = "local-syncer"

    def attach(self, contributors: Sequence[CrossReplicaContributor], interval: float | None) -> None:
        self.contributors = list(contributors)
