"""What became of one redriven message: its records' outcomes, split into cleaned, skipped and failed, what was lost,
and whether the message may be deleted (``cleanup.operations.redrive``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from cleanup.operations.stream_ranges import Lost
from schemas.outcomes import Outcome, Status

REMOVE = "REMOVE"


@dataclass
class MessageResult:
    """What became of one message's records."""

    kind: str
    outcomes: list[Outcome] = field(default_factory=list)
    lost: list[Lost] = field(default_factory=list)
    missing: int = 0
    error: str | None = None
    duplicate: str | None = None
    """The message repeats one already settled (its stored record redriven, or reported lost): nothing to do."""
    gone: str | None = None
    """The stored record is lost, not redriven: why, and what to do (the message is saved and reported once)."""

    @property
    def cleaned(self) -> list[Outcome]:
        """The records cleaned, or already clean (in a dry run: planned, as an enforce run would clean them)."""
        return [o for o in self.outcomes if o.status in (Status.CLEANED, Status.PLANNED)]

    @property
    def skipped(self) -> list[Outcome]:
        """The removals skipped under this run's settings (not a session, another table or region): the settings may
        be what is wrong (a shell that is not the function's), so a skip is not taken for clean."""
        return [o for o in self.outcomes if o.status is Status.SKIPPED and o.event_name == REMOVE]

    @property
    def ignored(self) -> list[Outcome]:
        """The records that are no removal (an insert, a modify): nothing to clean, whatever the settings."""
        return [o for o in self.outcomes if o.status is Status.SKIPPED and o.event_name != REMOVE]

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.failed]

    @property
    def clean(self) -> bool:
        """Every record cleaned or already clean (or no removal), none skipped, failed or lost."""
        return self.clean_but_skipped and not self.skipped

    @property
    def clean_but_skipped(self) -> bool:
        """Every record cleaned or already clean but for removals skipped, none failed or lost."""
        waiting = any(o.status is Status.DEFERRED for o in self.outcomes)
        return not (self.error or self.lost or self.missing or self.gone or self.failed or waiting)

    @property
    def settled(self) -> bool:
        """The message may go: it is clean, or its stored record is gone and its report saved."""
        return self.clean or (self.gone is not None and not self.error)

    def deletable(self, *, skipped_ok: bool = False) -> bool:
        """Whether the message may be deleted: it is settled; or, with ``skipped_ok`` (``--delete-skipped``: the
        operator read the reasons and takes them), every record is clean but for those skipped."""
        return self.settled or (skipped_ok and self.clean_but_skipped)
