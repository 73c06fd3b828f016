"""ReconfigureDialog: edit the window, page size, batch, scrub policy, prefix cache scope, pool sizes and — only on
an engine started with --allow-faults, in a red danger zone — the defences and faults.

Validate sends the changed keys; the engine answers with the capacity consequence and the
workers that will restart (`show_result`). Apply is enabled only while the fields hold
exactly the values that were validated; any edit disables it again. Input outside a field's
range is shown as invalid (red, with the limit), never clamped to something else, and
blocks Validate; applying a configuration whose capacity finding is ✗ asks first.
"""

from __future__ import annotations

import html

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QPushButton,
    QSpinBox,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from engine.wire.defences import DEFENCES, FAULTS
from gui import theme
from gui.model.engine_state import EngineState

PAGE_SIZES = [1 << i for i in range(11)]  # 1 .. 1024, the engine's range
SCRUB_CHOICES = (("zero", "zero — default"), ("poison", "poison — NaN / sentinel fill"),
                 ("none", "none — measurement only: freed pages keep old data"))
PREFIX_SCOPES = (("tenant", "tenant — shared within a tenant or one cache_salt (default)"),
                 ("global", "global — unsalted prompts shared across tenants: a timing side channel"),
                 ("off", "off — no prefix cache"))
INT_MAX = (1 << 31) - 1
VALIDATE_TIMEOUT_S = 20.0  # a validation checks the model files and the machine's memory: seconds, not minutes
STALE_REASON = "The engine is not answering (STALE): nothing can be validated or applied until it does."
# the valid range of each number field (the spin boxes accept 0 .. INT_MAX so that a value
# out of range stays visible as typed and is refused with this message, not clamped)
LIMITS = {"context_window": (1, INT_MAX), "max_batch": (1, 4096), "prefill_pages": (1, INT_MAX),
          "decode_pages": (1, INT_MAX)}
LABELS = {"context_window": "Context window", "max_batch": "Max batch", "prefill_pages": "Prefill pool",
          "decode_pages": "Decode pool"}
# flat key -> config path
KEYS = {
    "context_window": ("engine", "context_window"), "page_size": ("engine", "page_size"),
    "max_batch": ("engine", "max_batch"), "scrub_policy": ("engine", "scrub_policy"),
    "prefix_scope": ("prefix_cache", "scope"),
    "prefill_pages": ("pools", "prefill", "pages"), "decode_pages": ("pools", "decode", "pages"),
}
KEYS.update({f"defence_{d.name}": ("defences", d.name) for d in DEFENCES})
KEYS.update({f"fault_{f.name}": ("faults", f.name) for f in FAULTS})


def config_value(config: dict, path: tuple):
    for key in path:
        if not isinstance(config, dict) or key not in config:
            return None
        config = config[key]
    return config


def changes_between(original: dict, values: dict) -> dict:
    """Only the keys whose value differs from `original`, nested like the config."""
    changes: dict = {}
    for key, value in values.items():
        path = KEYS[key]
        if config_value(original, path) == value:
            continue
        node = changes
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return changes


def apply_enabled(validated: dict | None, values: dict, changes: dict, readonly: bool, refused: bool) -> bool:
    """Apply needs a successful validation of exactly these values, a change, and no refusal."""
    return not readonly and not refused and bool(changes) and validated == values


def out_of_range(values: dict) -> dict[str, str]:
    """field -> why, for every number outside LIMITS (naming the value and the limit)."""
    problems = {}
    for key, (low, high) in LIMITS.items():
        value = values[key]
        if not low <= value <= high:
            problems[key] = f"{LABELS[key]} {value:,} is outside {low:,}..{high:,}"
    return problems


def _spin() -> QSpinBox:
    box = QSpinBox()
    box.setRange(0, INT_MAX)
    box.setGroupSeparatorShown(True)
    box.setAlignment(Qt.AlignRight)
    return box


def _with_hint(field: QSpinBox, hint: QLabel) -> QWidget:
    """A pool's page count with the tokens it holds beside it (a local preview, not the verdict)."""
    row = QWidget()
    layout = QHBoxLayout(row)
    layout.setContentsMargins(0, 0, 0, 0)
    layout.addWidget(field, 1)
    hint.setMinimumWidth(hint.fontMetrics().horizontalAdvance("= 2,147,483,647 tokens, 2,147,483,647 short"))
    layout.addWidget(hint)
    return row


class ReconfigureDialog(QDialog):
    validate_requested = Signal(dict)  # changes
    apply_requested = Signal(dict)  # changes

    def __init__(self, state: EngineState, parent=None, *, timeout_s: float = VALIDATE_TIMEOUT_S):
        super().__init__(parent)
        self.setWindowTitle("Reconfigure engine")
        self.state = state
        self.timeout_s = timeout_s
        self._stale = bool(state.stale)  # the engine stopped answering: nothing can be asked
        self._waiting = QTimer(self)  # the engine's answer to Validate / Apply is due before it fires
        self._waiting.setSingleShot(True)
        self._waiting.timeout.connect(self._no_answer)
        self._asked = ""  # "Validate" or "Apply" while an answer is due
        self.original: dict = dict(state.config)
        self._readonly = False
        self._pending: dict | None = None  # values sent with the last Validate
        self._validated: dict | None = None  # values the engine accepted
        self._refused = False  # strict capacity would refuse the validated values

        self.confirm = self._ask  # (text) -> bool; tests replace it
        self._exceeds: list[str] = []  # ✗ findings of the last validation
        self.context_window = _spin()
        self.page_size = QComboBox()
        for size in PAGE_SIZES:
            self.page_size.addItem(f"{size} tokens", size)
        self.max_batch = _spin()
        self.scrub_policy = QComboBox()
        for value, label in SCRUB_CHOICES:
            self.scrub_policy.addItem(label, value)
        self.prefix_scope = QComboBox()
        for value, label in PREFIX_SCOPES:
            self.prefix_scope.addItem(label, value)
        self.prefill_pages = _spin()
        self.decode_pages = _spin()
        self.invalid_label = QLabel()
        self.invalid_label.setWordWrap(True)
        self.invalid_label.setStyleSheet(f"color: {theme.color('danger').name()}; font-weight: bold;")
        self.invalid_label.hide()
        self.defence_boxes = {d.name: QCheckBox(d.label) for d in DEFENCES}
        self.fault_boxes = {f.name: QCheckBox(f.label) for f in FAULTS}
        self.check_writer_tags = self.defence_boxes["writer_tag_check"]
        self.allow_faults = bool(state.engine.get("allow_faults"))
        self.writer_tags_note = QLabel("Dangerous: each defence off lets a class of leak through, and each fault "
                                       "injects a bug.\nOnly for reproducing incidents (engine started with "
                                       "--allow-faults).")
        self.pool_hints = {pool: QLabel() for pool in ("prefill", "decode")}
        self._load(self.original)

        form = QFormLayout()
        form.addRow("Context window (tokens)", self.context_window)
        form.addRow("Page size", self.page_size)
        form.addRow("Max batch", self.max_batch)
        form.addRow("Scrub policy (I5)", self.scrub_policy)
        form.addRow("Prefix cache (restarts the workers)", self.prefix_scope)
        form.addRow("Prefill pool (pages)", _with_hint(self.prefill_pages, self.pool_hints["prefill"]))
        form.addRow("Decode pool (pages)", _with_hint(self.decode_pages, self.pool_hints["decode"]))
        form.addRow(self.invalid_label)
        danger = QGroupBox("Danger zone: defences and faults")
        danger.setStyleSheet(f"QGroupBox {{ color: {theme.color('danger').name()}; font-weight: bold; }}")
        danger_layout = QVBoxLayout(danger)
        danger_layout.addWidget(self.writer_tags_note)
        for box in (*self.defence_boxes.values(), *self.fault_boxes.values()):
            danger_layout.addWidget(box)
        danger.setEnabled(self.allow_faults)
        if not self.allow_faults:
            danger.setToolTip("This engine was not started with --allow-faults")
        self.danger = danger

        # a text browser scrolls long verdicts instead of squeezing the form above it
        self.result_view = QTextBrowser()
        self.result_view.setOpenLinks(False)
        self.result_view.setMinimumHeight(7 * self.fontMetrics().height())
        self.result_view.setText("Validate to see the capacity consequence before applying.")

        self.validate_button = QPushButton("Validate")
        self.apply_button = QPushButton("Apply")
        self.apply_button.setAutoDefault(False)
        self.validate_button.setDefault(True)
        buttons = QDialogButtonBox(QDialogButtonBox.Close)
        buttons.addButton(self.validate_button, QDialogButtonBox.ActionRole)
        buttons.addButton(self.apply_button, QDialogButtonBox.ApplyRole)
        buttons.rejected.connect(self.reject)
        self.validate_button.clicked.connect(self.validate)
        self.apply_button.clicked.connect(self.apply)

        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.danger)
        layout.addWidget(QLabel("<b>Consequence</b>"))
        layout.addWidget(self.result_view, 1)
        layout.addWidget(buttons)
        for box in (self.context_window, self.max_batch, self.prefill_pages, self.decode_pages):
            box.valueChanged.connect(self._edited)
        for combo in (self.page_size, self.scrub_policy, self.prefix_scope):
            combo.currentIndexChanged.connect(self._edited)
        for box in (*self.defence_boxes.values(), *self.fault_boxes.values()):
            box.toggled.connect(self._edited)
        self.resize(max(640, self.sizeHint().width()), self.sizeHint().height())
        self._edited()
        if self._stale:
            self.result_view.setText(STALE_REASON)

    # ---- fields --------------------------------------------------------------------------
    def _load(self, config: dict) -> None:
        """Fill the fields from a config dict; missing keys take engine/config.py's defaults."""
        def get(key, default):
            value = config_value(config, KEYS[key])
            return default if value is None else value

        self.context_window.setValue(int(get("context_window", 2048)))
        self.page_size.setCurrentIndex(max(0, self.page_size.findData(int(get("page_size", 16)))))
        self.max_batch.setValue(int(get("max_batch", 16)))
        self.scrub_policy.setCurrentIndex(max(0, self.scrub_policy.findData(get("scrub_policy", "zero"))))
        self.prefix_scope.setCurrentIndex(max(0, self.prefix_scope.findData(get("prefix_scope", "tenant"))))
        self.prefill_pages.setValue(int(get("prefill_pages", 4096)))
        self.decode_pages.setValue(int(get("decode_pages", 4096)))
        for name, box in self.defence_boxes.items():
            box.setChecked(bool(get(f"defence_{name}", True)))
        for name, box in self.fault_boxes.items():
            box.setChecked(bool(get(f"fault_{name}", False)))

    def values(self) -> dict:
        """The fields as flat keys (see KEYS)."""
        return {
            "context_window": self.context_window.value(), "page_size": self.page_size.currentData(),
            "max_batch": self.max_batch.value(), "scrub_policy": self.scrub_policy.currentData(),
            "prefix_scope": self.prefix_scope.currentData(),
            "prefill_pages": self.prefill_pages.value(), "decode_pages": self.decode_pages.value(),
            **{f"defence_{n}": b.isChecked() for n, b in self.defence_boxes.items()},
            **{f"fault_{n}": b.isChecked() for n, b in self.fault_boxes.items()},
        }

    def changes(self) -> dict:
        """What differs from the engine's config, e.g. {"engine": {...}, "pools": {"decode": {"pages": N}}}."""
        return changes_between(self.original, self.values())

    def set_readonly(self, readonly: bool) -> None:
        self._readonly = bool(readonly)
        for field in (self.context_window, self.page_size, self.max_batch, self.scrub_policy, self.prefix_scope,
                      self.prefill_pages, self.decode_pages):
            field.setEnabled(not readonly)
        self.danger.setEnabled(self.allow_faults and not readonly)
        self._update_buttons()

    # ---- validate / apply ------------------------------------------------------------------
    def set_stale(self, stale: bool) -> None:
        """The engine stopped answering (True) or answers again: Validate and Apply follow."""
        stale = bool(stale)
        if stale != self._stale:
            self._stale = stale
            if stale and not self._asked:
                self.result_view.setText(f"<p style='color:{theme.color('warning').name()}'>"
                                         f"{html.escape(STALE_REASON)}</p>")
            elif not stale and not self._asked:
                self.result_view.setText("The engine answers again. Validate to see the capacity consequence "
                                         "before applying.")
            self._update_buttons()

    def _wait_for_answer(self, what: str) -> None:
        self._asked = what
        self._waiting.start(int(self.timeout_s * 1000))

    def _answered(self) -> None:
        self._asked = ""
        self._waiting.stop()

    def _no_answer(self) -> None:
        what, self._asked = self._asked, ""
        self._validated = None
        why = " (the engine is not answering: STALE)" if self._stale else ""
        self.result_view.setText(
            f"<p style='color:{theme.color('danger').name()}'>No answer to {html.escape(what)} from the engine "
            f"within {self.timeout_s:g} s{why}. Nothing was changed by this window; if the engine answers later, "
            "its status shows whether the configuration changed.</p>")
        self._update_buttons()

    def validate(self) -> None:
        if self._readonly or self._stale or self._asked or out_of_range(self.values()):
            return
        self._pending = self.values()
        self._validated = None
        self.result_view.setText("Validating…")
        self._wait_for_answer("Validate")
        self._update_buttons()
        self.validate_requested.emit(self.changes())

    def apply(self) -> None:
        if not self.apply_button.isEnabled():
            return
        if self._exceeds and not self.confirm(
                "The validated configuration does not fit:\n\n" + "\n".join(f"✗ {m}" for m in self._exceeds)
                + "\n\nApply it anyway?"):
            self.result_view.append("Not applied.")
            return
        self.apply_button.setEnabled(False)  # one apply per validation
        self.result_view.append("Applying…")
        self._wait_for_answer("Apply")
        self.apply_requested.emit(self.changes())

    def show_result(self, result: dict) -> None:
        """The engine's reply to reconfigure: findings, exceeds, restart, config, applied."""
        self._answered()
        findings = result.get("findings") or []
        refused = bool(result.get("exceeds")) and bool(config_value(result.get("config") or {},
                                                                    ("engine", "strict_capacity")))
        lines = []
        for f in findings:
            text = html.escape(str(f.get("message", "")))
            tone = theme.color("danger" if f.get("exceeds") else "ok").name()
            lines.append(f"<li style='color:{tone}'>{'✗' if f.get('exceeds') else '✓'} {text}</li>")
        restart = [str(w) for w in result.get("restart") or []]
        who = (f"Workers that drain their requests and restart: <b>{html.escape(', '.join(restart))}</b>"
               if restart else "No worker restarts; the change applies live.")
        parts = [f"<ul style='margin:0; -qt-list-indent:0'>{''.join(lines)}</ul>", f"<p>{who}</p>"]
        if refused:
            parts.append(f"<p style='color:{theme.color('danger').name()}'>Strict capacity refuses "
                         "this configuration.</p>")
        if result.get("applied"):
            self.original = dict(result.get("config") or self.original)
            self._load(self.original)
            parts.append("<p><b>Applied.</b></p>")
            self._validated = None
            self._exceeds = []
        elif result.get("valid"):
            self._validated = self._pending
            self._exceeds = [str(f.get("message", "")) for f in findings if f.get("exceeds")]
        self._refused = refused
        self.result_view.setText("".join(parts))
        self._update_buttons()

    def show_error(self, message: str) -> None:
        """The engine refused the change (or did not answer); nothing can be applied."""
        self._answered()
        self._validated = None
        self.result_view.setText(f"<p style='color:{theme.color('danger').name()}'>{html.escape(message)}</p>")
        self._update_buttons()

    def _edited(self, *_) -> None:
        values = self.values()
        tags_off = any(not v for k, v in values.items() if k.startswith("defence_")) or \
            any(v for k, v in values.items() if k.startswith("fault_"))
        self.writer_tags_note.setStyleSheet(f"color: {theme.color('danger' if tags_off else 'muted').name()};"
                                            + (" font-weight: bold;" if tags_off else ""))
        window, size = values["context_window"], values["page_size"]
        for pool, hint in self.pool_hints.items():
            tokens = values[f"{pool}_pages"] * size
            fits = tokens >= window
            hint.setText(f"= {tokens:,} tokens" + ("" if fits else f", {window - tokens:,} short"))
            hint.setStyleSheet(f"color: {theme.color('muted' if fits else 'danger').name()};")
        self._update_buttons()

    def _ask(self, text: str) -> bool:
        answer = QMessageBox.warning(self, "Apply a configuration that does not fit?", text,
                                     QMessageBox.Apply | QMessageBox.Cancel, QMessageBox.Cancel)
        return answer == QMessageBox.Apply

    def _update_buttons(self) -> None:
        values = self.values()
        problems = out_of_range(values)
        for key in LIMITS:
            field = getattr(self, key)
            field.setStyleSheet(f"QSpinBox {{ border: 2px solid {theme.color('danger').name()}; }}"
                                if key in problems else "")
            field.setToolTip(problems.get(key, ""))
        self.invalid_label.setText("; ".join(problems.values()) + (" — fix to validate." if problems else ""))
        self.invalid_label.setVisible(bool(problems))
        waiting = bool(self._asked)
        self.validate_button.setEnabled(not self._readonly and not problems and not self._stale and not waiting)
        self.validate_button.setToolTip(STALE_REASON if self._stale else "Waiting for the engine's answer…"
                                        if waiting else "")
        self.apply_button.setEnabled(not self._stale and not waiting and apply_enabled(
            self._validated, values, changes_between(self.original, values), self._readonly, self._refused))
