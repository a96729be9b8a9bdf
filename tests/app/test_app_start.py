"""Starting the app: nothing but its address is printed (no warning from Gradio about the app's own
handlers), and an address it cannot listen on is one line naming `--port`, not Gradio's traceback."""

from __future__ import annotations

import socket
import warnings

import pytest

import app


def test_building_the_app_warns_nothing() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        demo = app.build_app()
    demo.close()
    said = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught if issubclass(w.category, UserWarning)]
    assert said == [], said


def refusal(argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        app.check_address(app.parse_args(argv))
    assert isinstance(exited.value.code, str)  # a message (printed on stderr), never a traceback
    return exited.value.code


@pytest.mark.parametrize("port", ["99999", "0"])
def test_a_port_out_of_range_is_one_line_naming_the_flag(port: str) -> None:
    message = refusal(["--port", port])
    assert message.startswith(f"app.py: --port {port}:") and "1 to 65535" in message and "\n" not in message


def test_a_port_in_use_is_one_line_naming_the_flag() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        message = refusal(["--port", str(port), "--host", "127.0.0.1"])
    assert f"127.0.0.1:{port}" in message and "--port" in message and "\n" not in message


def test_a_free_port_passes() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    app.check_address(app.parse_args(["--port", str(port), "--host", "127.0.0.1"]))  # returns: no exit
