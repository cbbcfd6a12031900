"""Where a gateway keeps its ledger and config history: ``state.data_dir``, resolved from the config file."""

from __future__ import annotations

from pathlib import Path

import pytest

from spillgate.gateway.control.config import StateConfig
from spillgate.gateway.control.data_dir import data_directory, user_state_home


def test_an_absolute_data_dir_is_taken_as_it_is(tmp_path: Path) -> None:
    settings = StateConfig(data_dir=str(tmp_path / "ledger"))
    assert data_directory(settings, tmp_path / "conf" / "gateway.yaml") == tmp_path / "ledger"


def test_a_relative_data_dir_is_taken_from_the_config_files_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the working directory must not matter
    config = tmp_path / "conf" / "gateway.yaml"
    assert data_directory(StateConfig(data_dir="data"), config) == tmp_path / "conf" / "data"
    assert data_directory(StateConfig(data_dir="../var/sg"), config) == tmp_path / "conf" / ".." / "var" / "sg"


def test_a_home_relative_data_dir_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert data_directory(StateConfig(data_dir="~/sg"), tmp_path / "gateway.yaml") == tmp_path / "home" / "sg"


def test_without_data_dir_each_config_file_gets_its_own_directory_under_xdg_state_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    first = data_directory(StateConfig(), tmp_path / "a" / "gateway.yaml")
    second = data_directory(StateConfig(), tmp_path / "b" / "gateway.yaml")
    assert first.parent == second.parent == tmp_path / "state" / "spillgate"
    assert first != second, "two configs must not share a ledger by accident"
    assert first.name.startswith("gateway-") and second.name.startswith("gateway-")
    assert data_directory(StateConfig(), tmp_path / "a" / "gateway.yaml") == first, "the same file, the same place"


def test_the_same_config_reached_by_another_path_shares_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    (tmp_path / "conf").mkdir()
    monkeypatch.chdir(tmp_path)
    absolute = data_directory(StateConfig(), tmp_path / "conf" / "gateway.yaml")
    assert data_directory(StateConfig(), Path("conf/gateway.yaml")) == absolute
    assert data_directory(StateConfig(), Path("conf/../conf/gateway.yaml")) == absolute


def test_without_xdg_state_home_the_users_local_state_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert user_state_home() == tmp_path / "home" / ".local" / "state" / "spillgate"
    assert data_directory(StateConfig(), None) == tmp_path / "home" / ".local" / "state" / "spillgate" / "default"


@pytest.mark.parametrize("given", ["", "relative/state"])
def test_an_empty_or_relative_xdg_state_home_counts_as_unset(
    given: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", given)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert user_state_home() == tmp_path / "home" / ".local" / "state" / "spillgate"


def test_a_relative_data_dir_without_a_config_file_is_kept_relative() -> None:
    assert data_directory(StateConfig(data_dir="data"), None) == Path("data")
