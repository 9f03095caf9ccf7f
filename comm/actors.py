"""Ray helpers shared by every stage: spawn a group of actors, and wait on them with a timeout.

Only actor wrappers and the driver import Ray (docs/ARCHITECTURE.md section 3); algorithm code
never does.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError


class ActorGroupError(RuntimeError):
    """A remote call failed: an actor died or did not answer in time."""


def spawn_actor_group(
    cls: type,
    count: int,
    *args: Any,
    num_cpus: float = 1,
    num_gpus: float = 0,
    runtime_env: dict | None = None,
    placement: Any = None,
    first_bundle: int = 0,
    **kwargs: Any,
) -> list:
    """``count`` actors of ``cls`` (a plain class, wrapped here), each with the given resources.

    ``placement`` (optional, e.g. ``launch.cluster.Placement``) has ``strategy(i)`` giving the
    scheduling strategy of bundle i of a reserved placement group; actor j takes bundle
    ``first_bundle + j``."""
    remote_cls = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, runtime_env=runtime_env)(cls)
    actors = []
    for j in range(count):
        options: dict[str, Any] = {"max_restarts": 0}
        if placement is not None:
            options["scheduling_strategy"] = placement.strategy(first_bundle + j)
        actors.append(remote_cls.options(**options).remote(*args, **kwargs))
    return actors


def get(refs: list, *, timeout_s: float, what: str) -> list:
    """``ray.get`` with a timeout and a clear error naming ``what`` failed: a death among the
    calls is what it names, also when a peer's failure was reported first."""
    try:
        return ray.get(refs, timeout=timeout_s)
    except GetTimeoutError:
        for ref in refs:
            with contextlib.suppress(Exception):  # best effort; the caller stops anyway
                ray.cancel(ref)
        raise ActorGroupError(f"{what}: no answer within {timeout_s:.0f} s") from None
    except RayActorError as err:
        raise ActorGroupError(f"{what}: an actor died ({type(err).__name__}: {err})") from err
    except RayTaskError as err:
        # A member's death often surfaces first as its peers' failure (a DeepSpeed rank's
        # collective: "Connection closed by peer"): name the death, the cause, when one is reported.
        died = _a_death(refs, DEATH_GRACE_S)
        if died is None:
            raise
        cause = getattr(err, "cause", None) or err  # the exception raised inside the call
        raise ActorGroupError(
            f"{what}: an actor died ({type(died).__name__}: {died}); a peer failed with it "
            f"({type(cause).__name__}: {cause})"
        ) from died


DEATH_GRACE_S = 10.0  # how long a failed call waits for its peers' deaths to be reported


def _a_death(refs: list, grace_s: float) -> RayActorError | None:
    """The error of a call in ``refs`` whose actor died, if one is reported within
    ``grace_s``; None when every call ends otherwise or none ends in time."""
    deadline = time.monotonic() + grace_s
    pending = list(refs)
    while pending:
        left = max(0.0, deadline - time.monotonic())
        ready, pending = ray.wait(pending, num_returns=1, timeout=left)
        if not ready:
            return None
        try:
            ray.get(ready[0])
        except RayActorError as err:
            return err
        except Exception:  # another call's own failure: keep looking
            continue
    return None


class ActorDied(ActorGroupError):
    """The actor of one call died (killed, crashed, out of memory): the caller may restart it."""


def settle(refs: dict, *, timeout_s: float, what: str) -> dict:
    """Wait for every ref of ``{key: ref}``; returns ``{key: result}`` where a call whose actor
    died gives an :class:`ActorDied` instead of raising (the caller decides what to restart).
    Any other failure (an exception inside the call, the timeout) raises as :func:`get` does."""
    deadline = time.monotonic() + timeout_s
    pending = dict(refs)
    out: dict = {}
    while pending:
        left = deadline - time.monotonic()
        ready, _ = ray.wait(list(pending.values()), num_returns=1, timeout=max(0.0, left))
        if not ready:
            for ref in pending.values():
                with contextlib.suppress(Exception):
                    ray.cancel(ref)
            raise ActorGroupError(f"{what}: no answer within {timeout_s:.0f} s")
        for key in [k for k, r in pending.items() if r == ready[0]]:
            ref = pending.pop(key)
            try:
                out[key] = ray.get(ref)
            except RayActorError as err:
                out[key] = ActorDied(f"{what}: an actor died ({type(err).__name__}: {err})")
    return out
