"""What every event handler of the app shares: a failure said in one line in the slot, never
raised to Gradio (`user_errors`), and which of the two slots' runs a handler draws."""

from __future__ import annotations

import functools
import traceback
from typing import Any

import gradio as gr

from specviz.app import serve
from specviz.app.messages import plain_trace_message
from specviz.errors import SpecvizError
from specviz.trace.io import TraceError
from specviz.views import LoadedRun
from specviz.views.safe_text import md_text


def status_update(message: str = "") -> Any:
    """The slot's one-line status: shown with a message, hidden when empty."""
    # The message may quote an upload (its name, a field it invented): escaped, one line.
    return gr.update(value=f"⚠️ {md_text(message, 400)}" if message else "", visible=bool(message))


def user_errors(status: Any) -> Any:
    """Turn every failure into a one-line message in `status` (and a warning toast), never an exception.

    A raised gr.Error marks every output of the event with Gradio's red "Error" badge and blanks
    them until the next update; a message leaves every output as it was: the slot keeps its run.
    """

    def decorate(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except TraceError as exc:  # a file that is no trace: said in plain words (app.messages)
                message = plain_trace_message(str(exc))
            except (gr.Error, SpecvizError, ValueError) as exc:
                message = exc.message if isinstance(exc, gr.Error) else str(exc)
            except Exception as exc:  # never a traceback in the UI; the server log keeps it
                traceback.print_exc()
                message = f"unexpected error: {type(exc).__name__}: {exc}"
            message = serve.without_paths(message)  # never a server path in the page
            gr.Warning(message)
            return {status: status_update(message)}

        return wrapper

    return decorate


def pick(label: str, run_a: LoadedRun | None, run_b: LoadedRun | None) -> tuple[LoadedRun | None, LoadedRun | None]:
    """(inspected run, the other one) for the inspect switch's value."""
    return (run_a, run_b) if label == "A" else (run_b, run_a)


def inspected(label: str, run_a: LoadedRun | None, run_b: LoadedRun | None) -> LoadedRun | None:
    return run_a if label == "A" else run_b


def last_step(loaded: LoadedRun | None) -> int:
    return max(loaded.step_count - 1, 0) if loaded is not None else 0
