"""The action API, as plugin writers import it: what one kind of resource declares so that it is freed behind the one
fence (``cleanup.core.action_api`` defines it, below both the host that runs the kinds and the kinds themselves).

See ``cleanup.core.action_api`` for what a kind declares and how its gates give permits; ``docs/actions.md`` walks
through writing one.
"""

from cleanup.core.action_api import (
    API_VERSION,
    ActionKind,
    Context,
    Gate,
    Guard,
    Holding,
    Host,
    Orphan,
    ReadOnlyClients,
    Run,
    Sender,
    Shared,
    Step,
)

__all__ = [
    "API_VERSION",
    "ActionKind",
    "Context",
    "Gate",
    "Guard",
    "Holding",
    "Host",
    "Orphan",
    "ReadOnlyClients",
    "Run",
    "Sender",
    "Shared",
    "Step",
]
