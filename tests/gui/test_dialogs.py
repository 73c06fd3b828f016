"""Reconfigure, attach and about dialogs; the reconfigure replies are built as the engine builds them."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QSettings
from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import QDialogButtonBox

from engine.capacity import check_capacity, exceeding
from engine.config import EngineConfig
from gui import theme
from gui.dialogs.about_dialog import AboutDialog
from gui.dialogs.attach_dialog import AttachDialog, address_error, recent_engines
from gui.dialogs.reconfigure_dialog import ReconfigureDialog, changes_between
from gui.model.engine_state import EngineState

BASE = EngineConfig().replace(engine={"context_window": 8192, "page_size": 16},
                              pools={"prefill": {"pages": 1024}, "decode": {"pages": 2048}})


def engine_state(config: EngineConfig = BASE) -> EngineState:
    state = EngineState()
    state.apply_status({"config": config.to_dict(), "workers": [], "capacity": []})
    return state


def reconfigure_reply(changes: dict, *, restart=("decode-0", "prefill-0"), applied=False) -> dict:
    """What ControlOps.op_reconfigure answers for `changes` on BASE."""
    new = BASE.replace(**changes)
    findings = check_capacity(new)
    return {"valid": True, "applied": applied, "findings": [f.to_dict() for f in findings],
            "exceeds": bool(exceeding(findings)), "restart": sorted(restart), "config": new.to_dict(),
            "consequence": [f.message() for f in findings]}


def line_colours(dialog) -> dict[str, str]:
    """Each line of the result view -> the colour its first character is drawn in."""
    doc, colours = dialog.result_view.document(), {}
    block = doc.begin()
    while block.isValid():
        if block.text().strip():
            cursor = QTextCursor(block)
            cursor.setPosition(block.position() + 1)
            colours[block.text()] = cursor.charFormat().foreground().color().name()
        block = block.next()
    return colours


@pytest.fixture
def dialog(qtbot):
    dlg = ReconfigureDialog(engine_state())
    qtbot.addWidget(dlg)
    return dlg


def test_fields_are_prefilled_from_the_engine_config(dialog):
    values = dialog.values()
    assert {k: v for k, v in values.items() if not k.startswith(("defence_", "fault_"))} == {
        "context_window": 8192, "page_size": 16, "max_batch": 16, "scrub_policy": "zero",
        "prefix_scope": "tenant", "prefill_pages": 1024, "decode_pages": 2048}
    assert all(v for k, v in values.items() if k.startswith("defence_"))
    assert not any(v for k, v in values.items() if k.startswith("fault_"))
    assert dialog.changes() == {}
    assert "measurement only" in dialog.scrub_policy.itemText(dialog.scrub_policy.findData("none"))


def test_changes_hold_only_changed_keys(dialog):
    dialog.decode_pages.setValue(4096)
    dialog.scrub_policy.setCurrentIndex(dialog.scrub_policy.findData("poison"))
    assert dialog.changes() == {"engine": {"scrub_policy": "poison"}, "pools": {"decode": {"pages": 4096}}}
    dialog.scrub_policy.setCurrentIndex(dialog.scrub_policy.findData("zero"))
    assert dialog.changes() == {"pools": {"decode": {"pages": 4096}}}
    assert changes_between({}, {"max_batch": 8}) == {"engine": {"max_batch": 8}}


def test_the_prefix_cache_scope_is_a_change_like_the_others(qtbot):
    """Prefilled from the engine's [prefix_cache] scope; a new one is sent under its section
    (the engine restarts the workers for it); global says what it costs."""
    dlg = ReconfigureDialog(engine_state(BASE.replace(prefix_cache={"scope": "off"})))
    qtbot.addWidget(dlg)
    assert dlg.values()["prefix_scope"] == "off" and dlg.changes() == {}
    dlg.prefix_scope.setCurrentIndex(dlg.prefix_scope.findData("global"))
    assert dlg.changes() == {"prefix_cache": {"scope": "global"}}
    assert "side channel" in dlg.prefix_scope.currentText()
    with qtbot.waitSignal(dlg.validate_requested, timeout=1000) as sent:
        dlg.validate_button.click()
    assert sent.args == [{"prefix_cache": {"scope": "global"}}]
    dlg.set_readonly(True)
    assert not dlg.prefix_scope.isEnabled()


def test_apply_needs_a_validation_of_exactly_the_current_values(dialog, qtbot):
    assert not dialog.apply_button.isEnabled()
    dialog.context_window.setValue(16384)
    assert not dialog.apply_button.isEnabled()  # not validated yet
    with qtbot.waitSignal(dialog.validate_requested, timeout=1000) as sent:
        dialog.validate_button.click()
    assert sent.args == [{"engine": {"context_window": 16384}}]
    assert not dialog.apply_button.isEnabled()  # no answer yet
    dialog.show_result(reconfigure_reply(sent.args[0]))
    assert dialog.apply_button.isEnabled()
    dialog.max_batch.setValue(8)  # an edit invalidates the validation
    assert not dialog.apply_button.isEnabled()
    dialog.max_batch.setValue(16)  # back to exactly the validated values
    assert dialog.apply_button.isEnabled()
    with qtbot.waitSignal(dialog.apply_requested, timeout=1000) as applied:
        dialog.apply_button.click()
    assert applied.args == [{"engine": {"context_window": 16384}}]
    dialog.show_result(reconfigure_reply(applied.args[0], applied=True))
    assert dialog.changes() == {} and not dialog.apply_button.isEnabled()
    assert "Applied" in dialog.result_view.toPlainText()


def test_a_late_answer_for_edited_fields_does_not_enable_apply(dialog, qtbot):
    dialog.context_window.setValue(16384)
    dialog.validate()
    dialog.decode_pages.setValue(999)
    dialog.show_result(reconfigure_reply({"engine": {"context_window": 16384}}))
    assert not dialog.apply_button.isEnabled()


def test_show_result_renders_findings_with_exceeding_ones_red_and_restarts(dialog):
    dialog.prefill_pages.setValue(100)
    dialog.validate()
    reply = reconfigure_reply(dialog.changes(), restart=("prefill-0",))
    dialog.show_result(reply)
    text = dialog.result_view.toPlainText()
    bad = next(f for f in reply["findings"] if f["exceeds"])
    assert bad["message"] in text and "1,600 tokens" in text
    assert "prefill-0" in text and "restart" in text
    colour = line_colours(dialog)
    danger = theme.color("danger").name()
    assert [c for line, c in colour.items() if "exceeds" in line] == [danger]
    assert all(c != danger for line, c in colour.items() if "fits" in line)
    assert dialog.apply_button.isEnabled()  # not strict: the operator may apply with the warning shown


def test_out_of_range_input_is_shown_invalid_never_clamped(dialog):
    """Issue 15, item 7: a window of 0 became 2,048 and a max batch of 0 became 16, silently."""
    dialog.context_window.lineEdit().setText("0")
    dialog.context_window.interpretText()
    dialog.max_batch.setValue(5000)
    values = dialog.values()
    assert values["context_window"] == 0 and values["max_batch"] == 5000  # kept as typed
    assert not dialog.invalid_label.isHidden()
    assert "Context window 0 is outside 1..2,147,483,647" in dialog.invalid_label.text()
    assert "Max batch 5,000 is outside 1..4,096" in dialog.invalid_label.text()
    assert "Max batch 5,000" in dialog.max_batch.toolTip()
    assert not dialog.validate_button.isEnabled() and not dialog.apply_button.isEnabled()
    sent = []
    dialog.validate_requested.connect(sent.append)
    dialog.validate()
    assert sent == []  # nothing out of range reaches the engine
    dialog.context_window.setValue(4096)
    dialog.max_batch.setValue(32)
    assert dialog.invalid_label.isHidden() and dialog.validate_button.isEnabled()


def test_applying_a_configuration_that_does_not_fit_asks_first(dialog, qtbot):
    """Issue 15, item 7: a change whose capacity finding is ✗ was applied without a question."""
    asked = []
    answers = iter([False, True])
    dialog.confirm = lambda text: asked.append(text) or next(answers)
    applied = []
    dialog.apply_requested.connect(applied.append)
    dialog.prefill_pages.setValue(100)
    dialog.validate()
    dialog.show_result(reconfigure_reply(dialog.changes()))
    assert dialog.apply_button.isEnabled()
    dialog.apply_button.click()  # the operator cancels
    assert len(asked) == 1 and "1,600 tokens" in asked[0] and applied == []
    assert "Not applied" in dialog.result_view.toPlainText() and dialog.apply_button.isEnabled()
    dialog.apply_button.click()  # and then confirms
    assert len(asked) == 2 and applied == [{"pools": {"prefill": {"pages": 100}}}]
    # a configuration that fits is applied without a question
    dialog.show_result(reconfigure_reply(applied[0], applied=True))
    dialog.prefill_pages.setValue(1024)
    dialog.validate()
    dialog.show_result(reconfigure_reply(dialog.changes()))
    dialog.apply_button.click()
    assert len(asked) == 2 and len(applied) == 2


def test_strict_capacity_refusal_and_errors_keep_apply_disabled(qtbot):
    dlg = ReconfigureDialog(engine_state(BASE.replace(engine={"strict_capacity": True})))
    qtbot.addWidget(dlg)
    dlg.prefill_pages.setValue(100)
    dlg.validate()
    reply = reconfigure_reply(dlg.changes())
    reply["config"]["engine"]["strict_capacity"] = True
    dlg.show_result(reply)
    assert not dlg.apply_button.isEnabled() and "Strict capacity refuses" in dlg.result_view.toPlainText()
    dlg.show_error("reconfigure refused: engine.page_size = 3 must be a power of two")
    assert "power of two" in dlg.result_view.toPlainText() and not dlg.apply_button.isEnabled()


def test_danger_zone_only_with_allow_faults(qtbot):
    state = engine_state()
    dlg = ReconfigureDialog(state)
    qtbot.addWidget(dlg)
    assert not dlg.danger.isEnabled()  # an engine without --allow-faults
    state.engine["allow_faults"] = True
    dlg = ReconfigureDialog(state)
    qtbot.addWidget(dlg)
    assert dlg.danger.isEnabled()
    dlg.fault_boxes["placeholder_on_reject"].setChecked(True)
    dlg.defence_boxes["manifest_check"].setChecked(False)
    assert dlg.changes() == {"faults": {"placeholder_on_reject": True}, "defences": {"manifest_check": False}}


def test_writer_tags_warning_and_readonly(dialog):
    assert "I1" in dialog.check_writer_tags.text()
    dialog.check_writer_tags.setChecked(False)
    assert dialog.changes() == {"defences": {"writer_tag_check": False}}
    assert "Dangerous" in dialog.writer_tags_note.text()
    dialog.validate()
    dialog.show_result(reconfigure_reply(dialog.changes(), restart=()))
    assert dialog.apply_button.isEnabled()
    dialog.set_readonly(True)
    assert not dialog.apply_button.isEnabled() and not dialog.validate_button.isEnabled()
    assert not dialog.context_window.isEnabled()


# ---- attach ----------------------------------------------------------------------------------

@pytest.mark.parametrize("address, ok", [
    ("tcp://127.0.0.1:5555", True), ("tcp://gpu-box.local:80", True), ("tcp://[::1]:5555", True),
    ("ipc:///tmp/pagewarden/control", True), ("tcp://gpu-box", False), ("tcp://gpu-box:0", False),
    ("tcp://gpu-box:70000", False), ("http://gpu-box:5555", False), ("ipc://", False), ("", False),
    ("tcp://*:5555", False),
])
def test_address_validation(address, ok):
    assert (address_error(address) is None) == ok


@pytest.fixture
def settings(tmp_path):
    s = QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat)
    s.setValue("recent_engines", ["tcp://newest:1", "tcp://older:2"])
    return s


def test_attach_dialog_inline_error_recent_list_and_values(qtbot, settings, tmp_path):
    dlg = AttachDialog(settings=settings)
    qtbot.addWidget(dlg)
    ok = dlg.buttons.button(QDialogButtonBox.Ok)
    assert [dlg.address.itemText(i) for i in range(dlg.address.count())] == ["tcp://newest:1", "tcp://older:2"]
    assert dlg.address.currentText() == "tcp://newest:1" and ok.isEnabled()
    dlg.address.setCurrentText("tcp://gpu-box")
    assert not ok.isEnabled() and "tcp://host:port" in dlg.error.text() and not dlg.error.isHidden()
    dlg.address.setCurrentText("tcp://gpu-box:5555")
    dlg.server_key.setText(str(tmp_path / "missing.key"))
    assert not ok.isEnabled() and "not found" in dlg.error.text()
    key = tmp_path / "server.key"
    key.write_text("public")
    dlg.server_key.setText(str(key))
    dlg.readonly.setChecked(True)
    assert ok.isEnabled() and dlg.error.isHidden()
    assert dlg.result_values() == {"endpoint": "tcp://gpu-box:5555", "server_key": str(key),
                                   "client_keys": None, "readonly": True}
    dlg.accept()
    assert recent_engines(settings) == ["tcp://gpu-box:5555", "tcp://newest:1", "tcp://older:2"]


def test_attach_dialog_takes_the_recent_list_it_is_given(qtbot, settings):
    dlg = AttachDialog(["ipc:///tmp/pw/ctl"], settings=settings)
    qtbot.addWidget(dlg)
    assert dlg.address.count() == 1 and dlg.result_values()["endpoint"] == "ipc:///tmp/pw/ctl"


# ---- about ------------------------------------------------------------------------------------

def test_about_dialog_lists_version_invariants_and_shortcuts(qtbot):
    dlg = AboutDialog("9.8.7", {"Reconfigure": "Ctrl+R", "Ask for a keyframe": "F5"})
    qtbot.addWidget(dlg)
    text = dlg.text.text()
    assert "9.8.7" in text and "<code>Ctrl+R</code>" in text and "Ask for a keyframe" in text
    assert all(f"I{i} " in text for i in range(1, 7))
