"""Settings a script asks for that Salus overrides are named, not silently dropped: PyTorch's
allocator configuration, CUDA_VISIBLE_DEVICES set after Salus initialized CUDA, and an allocator
the script installs over Salus's. (The CUDA paths are driven here with PyTorch's answers
replaced; scripts/gpu_check.sh runs them on a GPU.)"""
from __future__ import annotations

import warnings

import pytest

import salus
import salus.torch as st

torch = pytest.importorskip("torch")


def test_pytorch_allocator_options_are_named_as_ignored() -> None:
    got = st.ignored_alloc_conf({
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True, max_split_size_mb:128",
        "PYTORCH_ALLOC_CONF": "backend:cudaMallocAsync",
        "HOME": "/root"})
    assert [w.setting for w in got] == ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"]
    assert isinstance(got[0], salus.SettingIgnored) and isinstance(got[0], UserWarning)
    assert got[0].value == "expandable_segments:True, max_split_size_mb:128"
    assert "(expandable_segments, max_split_size_mb)" in str(got[0])
    assert "backend" in str(got[1]) and "is ignored" in str(got[1])
    assert st.ignored_alloc_conf({"PYTORCH_CUDA_ALLOC_CONF": "  "}) == []


def test_an_allocator_installed_over_salus_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(st, "_mode", "cuda")
    monkeypatch.setattr(st, "_installed_allocator", "salus")
    monkeypatch.setattr(torch.cuda, "get_allocator_backend", lambda: "salus")
    st.check_allocator_kept()  # still Salus's: nothing to say
    monkeypatch.setattr(torch.cuda, "get_allocator_backend", lambda: "pluggable")
    with pytest.raises(salus.NotSupported) as e:
        st.check_allocator_kept()
    assert e.value.allocator == "pluggable"
    assert "change_current_allocator" in str(e.value)
    monkeypatch.setattr(st, "_mode", "cpu")
    st.check_allocator_kept()  # the CPU glue replaces no CUDA allocator


def test_visible_devices_set_by_the_script_are_named_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    state = st._Shared(runtime=None, job=None, hook=None)  # type: ignore[arg-type]
    monkeypatch.setattr(st, "_mode", "cuda")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        state.check_visible_devices()
        assert seen == []
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
        state.check_visible_devices()
        state.check_visible_devices()
    assert len(seen) == 1
    w = seen[0].message
    assert isinstance(w, salus.SettingIgnored)
    assert (w.setting, w.value) == ("CUDA_VISIBLE_DEVICES", "1")
    assert "command line" in w.reason
