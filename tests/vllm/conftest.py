"""tests/vllm: real vLLM (CPU), in its own venv (requirements-vllm.txt, .ci/vllm). Without it every
test here skips, by design (the main environment pins a transformers vLLM 0.32 does not accept):
the skip happens in the `vllm_installed` fixture, so it is a test's, marked allowed under CI."""

import importlib.util

import pytest

collect_ignore = ["offline_script.py", "faulty_script.py"]  # scripts the tests and docs run, not tests
NO_VLLM = "vLLM is not installed here: tests/vllm run in the vLLM venv (requirements-vllm.txt, .ci/vllm)"


def pytest_collection_modifyitems(items):
    for item in items:
        if "vllm_installed" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.allowed_skip(reason=NO_VLLM))


@pytest.fixture(scope="session")
def vllm_installed():
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:  # tests/ is on sys.path: its vllm folder is no vLLM
        pytest.skip(NO_VLLM)


# vLLM 0.32 scans every loaded module when a worker starts (triton_utils/dispatcher.py) and fails
# on one of llvmlite's objects, which the n-gram proposer's numba imports: an engine built after an
# n-gram engine in one process does not start. So the n-gram engine is built last.
ORDER = ("none", "draft_model", "eagle", "ngram")


@pytest.fixture(scope="session")
def llms(vllm_installed, tmp_path_factory):
    """One engine per speculative method, all built at first use (n-gram last), shared by every test."""
    from vllm_runs import make_llm

    head = tmp_path_factory.mktemp("eagle-head")
    built = {method: make_llm(method, head) for method in ORDER}
    return built.__getitem__
