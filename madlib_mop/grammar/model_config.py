"""Compile and fit parameters, and the grids they are generated from: parsed, never run.

MADlib writes parameters as Python-like text:
    compile: optimizer='Adam(lr=0.001)',loss='categorical_crossentropy',metrics=['accuracy']
    fit:     batch_size=64,epochs=1
    grid:    {'loss': ['categorical_crossentropy'],
              'optimizer_params_list': [{'optimizer': ['Adam'], 'lr': [0.001, 0.01]}],
              'metrics': ['accuracy']}
Such text is read with Python's parser (`ast.parse`) and only literal values are accepted
(numbers, strings, booleans, None, lists, tuples, dicts); names of optimizers, losses and
metrics must be on the whitelists below.  Nothing is ever evaluated.  Grids may also be JSON.
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Collection, Iterable

from madlib_mop import errors
from madlib_mop.errors import MadlibMopError

# Keras 3 optimizers, by the lower-case name MADlib users may write.
OPTIMIZERS = {name.lower(): name for name in (
    "SGD", "Adam", "AdamW", "Adamax", "Adagrad", "Adadelta", "RMSprop", "Nadam", "Ftrl",
    "Lion", "Lamb", "Adafactor")}
# The keyword arguments of Keras 3's optimizers (keras 3.15, pinned in pyproject.toml; a
# runtime test holds this table equal to Keras' signatures): those all take, and each one's.
OPTIMIZER_COMMON_PARAMETERS = frozenset({
    "learning_rate", "weight_decay", "clipnorm", "clipvalue", "global_clipnorm", "use_ema",
    "ema_momentum", "ema_overwrite_frequency", "loss_scale_factor",
    "gradient_accumulation_steps", "name"})
OPTIMIZER_PARAMETERS = {
    "SGD": frozenset({"momentum", "nesterov"}),
    "Adam": frozenset({"beta_1", "beta_2", "epsilon", "amsgrad"}),
    "AdamW": frozenset({"beta_1", "beta_2", "epsilon", "amsgrad"}),
    "Adamax": frozenset({"beta_1", "beta_2", "epsilon"}),
    "Adagrad": frozenset({"epsilon", "initial_accumulator_value"}),
    "Adadelta": frozenset({"epsilon", "rho"}),
    "RMSprop": frozenset({"rho", "momentum", "epsilon", "centered"}),
    "Nadam": frozenset({"beta_1", "beta_2", "epsilon"}),
    "Ftrl": frozenset({"beta", "initial_accumulator_value", "l1_regularization_strength",
                       "l2_regularization_strength", "l2_shrinkage_regularization_strength",
                       "learning_rate_power"}),
    "Lion": frozenset({"beta_1", "beta_2"}),
    "Lamb": frozenset({"beta_1", "beta_2", "epsilon"}),
    "Adafactor": frozenset({"beta_2_decay", "epsilon_1", "epsilon_2", "clip_threshold",
                            "relative_step"}),
}
# Keras 2 spellings of Keras 3 optimizer arguments.
OPTIMIZER_ALIASES = {"lr": "learning_rate"}
# Keras 2's decay (MADlib's examples use it): lr / (1 + decay * iterations), which Keras 3
# computes as a schedule (`runtime.training.optimizer_arguments`).
DECAY = "decay"
# Ranges Keras does not check itself (a negative learning rate trains "uphill" silently).
_POSITIVE = (lambda v: v > 0, "greater than 0")
_FRACTION = (lambda v: 0 <= v < 1, "in [0, 1)")
OPTIMIZER_RANGES = {
    # 0 is allowed: it keeps the weights (e.g. to measure a pretrained model as it is).
    "learning_rate": (lambda v: v >= 0, "at least 0"), "epsilon": _POSITIVE, "clipnorm": _POSITIVE,
    "clipvalue": _POSITIVE, "global_clipnorm": _POSITIVE,
    "beta_1": _FRACTION, "beta_2": _FRACTION, "rho": _FRACTION, "ema_momentum": _FRACTION,
    "momentum": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "weight_decay": (lambda v: v >= 0, "at least 0"),
    "initial_accumulator_value": (lambda v: v >= 0, "at least 0"),
    DECAY: (lambda v: v >= 0, "a number at least 0"),
}

LOSSES = frozenset({
    "binary_crossentropy", "binary_focal_crossentropy", "categorical_crossentropy",
    "categorical_focal_crossentropy", "sparse_categorical_crossentropy", "categorical_hinge",
    "hinge", "squared_hinge", "cosine_similarity", "huber", "log_cosh", "kl_divergence",
    "poisson", "mean_squared_error", "mean_absolute_error", "mean_absolute_percentage_error",
    "mean_squared_logarithmic_error", "mse", "mae", "mape", "msle", "kld",
})
METRICS = frozenset({
    "accuracy", "acc", "binary_accuracy", "categorical_accuracy",
    "sparse_categorical_accuracy", "top_k_categorical_accuracy",
    "sparse_top_k_categorical_accuracy", "binary_crossentropy", "categorical_crossentropy",
    "sparse_categorical_crossentropy", "kl_divergence", "poisson", "hinge", "squared_hinge",
    "categorical_hinge", "cosine_similarity", "mean_squared_error", "mean_absolute_error",
    "mean_absolute_percentage_error", "mean_squared_logarithmic_error", "mse", "mae", "mape",
    "msle", "root_mean_squared_error",
})
# top_<k>_accuracy: what MADlib's docs load as a custom function (load_top_k_accuracy_function);
# here Keras' own top-k accuracy with that k, reported under that name.
TOP_K_ACCURACY = re.compile(r"top_([1-9][0-9]{0,5})_accuracy")
COMPILE_KEYS = ("optimizer", "loss", "metrics", "loss_weights", "weighted_metrics",
                "sample_weight_mode")
# Keras 2 compile arguments that Keras 3 dropped: accepted with their default only (the
# caller says so in a NOTICE), refused with any other value.
DROPPED_COMPILE_KEYS = {"sample_weight_mode": None}
FIT_KEYS = ("batch_size", "epochs", "verbose", "shuffle", "class_weight", "initial_epoch",
            "steps_per_epoch", "callbacks")
# The callbacks fit_params may name: checked and recorded, never built (see parse_fit_params).
CALLBACKS = ("TensorBoard",)
DEFAULT_OPTIMIZER = "RMSprop"  # Keras' own default, and MADlib's when a grid names none


def _syntax_error(what: str, text: str, why: str) -> MadlibMopError:
    return MadlibMopError(
        f"{what} is not valid: {why}",
        sqlstate=errors.SYNTAX_ERROR,
        detail=f"Got: {text[:300]}",
        hint="Write key=value pairs separated by commas with literal values, e.g. "
             "optimizer='Adam(lr=0.001)',loss='categorical_crossentropy',metrics=['accuracy'] "
             "or batch_size=32,epochs=1.",
    )


def _literal(node: ast.AST, what: str, text: str, names_are_strings: bool) -> Any:
    """A literal value; bare names read as strings where MADlib allows unquoted values."""
    if names_are_strings and isinstance(node, ast.Name):
        return node.id
    if names_are_strings and isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(item, what, text, names_are_strings) for item in node.elts]
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        raise _syntax_error(what, text, f"'{ast.unparse(node)[:80]}' is not a literal value") from None


@dataclass(frozen=True)
class Callback:
    """A Keras callback as fit_params writes it, e.g. TensorBoard(log_dir='/tmp/logs'): its
    name and literal keyword arguments, read but never built."""

    name: str
    arguments: tuple[tuple[str, Any], ...]

    def __repr__(self) -> str:  # the source text, so that fit_params_text renders it
        return f"{self.name}({', '.join(f'{k}={v!r}' for k, v in self.arguments)})"


def _callback(node: ast.AST, what: str, text: str) -> Callback:
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args
            and all(k.arg is not None for k in node.keywords)):
        raise _syntax_error(what, text, f"'{ast.unparse(node)[:80]}' is not a callback such as "
                                        "TensorBoard(log_dir='/tmp/logs')")
    return Callback(node.func.id, tuple((k.arg, _literal(k.value, what, text, False))
                                        for k in node.keywords))


def parse_keyword_text(text: str | None, what: str, *, names_are_strings: bool = False,
                       call_keys: Iterable[str] = ()) -> dict[str, Any]:
    """'a=1, b=[2, 3]' -> {'a': 1, 'b': [2, 3]}, by Python's parser, literals only.

    Keys in `call_keys` may hold a call such as Adam(lr=0.1), returned as its source text;
    `callbacks` a list of calls such as [TensorBoard(log_dir='/tmp')], returned as Callbacks.
    """
    if text is None or not text.strip():
        return {}
    try:
        tree = ast.parse(f"f({text.strip()})", mode="eval")
    except SyntaxError as error:
        raise _syntax_error(what, text, error.msg) from None
    call = tree.body
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "f"):
        raise _syntax_error(what, text, "expected key=value pairs")
    if call.args or any(keyword.arg is None for keyword in call.keywords):
        raise _syntax_error(what, text, "every value needs a key (key=value)")
    result: dict[str, Any] = {}
    for keyword in call.keywords:
        if keyword.arg in result:
            raise _syntax_error(what, text, f"{keyword.arg} is given twice")
        if keyword.arg in call_keys and isinstance(keyword.value, (ast.Call, ast.Name)):
            result[keyword.arg] = ast.unparse(keyword.value)
        elif keyword.arg == "callbacks" and isinstance(keyword.value, (ast.List, ast.Tuple)):
            result[keyword.arg] = [_callback(item, what, text) for item in keyword.value.elts]
        else:
            result[keyword.arg] = _literal(keyword.value, what, text, names_are_strings)
    return result


# ---- optimizers ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Optimizer:
    name: str  # the Keras class name
    arguments: tuple[tuple[str, Any], ...]  # as written (lr kept as lr)

    def __str__(self) -> str:
        return f"{self.name}({','.join(f'{k}={_render(v)}' for k, v in self.arguments)})"

    def written_arguments(self) -> dict[str, Any]:
        """Keras 3 names, values as written (decay kept): comparable and hashable."""
        return {OPTIMIZER_ALIASES.get(k, k): v for k, v in self.arguments}

    @property
    def scheduled(self) -> bool:
        """Whether the learning rate is a schedule (a nonzero decay), not a variable."""
        return bool(self.written_arguments().get(DECAY))


def _render(value: Any) -> str:
    return repr(value) if not isinstance(value, float) else repr(float(value))


def optimizer_parameters(name: str) -> frozenset[str]:
    """The keyword arguments the Keras optimizer class accepts."""
    return OPTIMIZER_COMMON_PARAMETERS | OPTIMIZER_PARAMETERS[name]


def make_optimizer(name: str, arguments: Iterable[tuple[str, Any]], text: str) -> Optimizer:
    canonical = OPTIMIZERS.get(str(name).strip().lower())
    if canonical is None:
        raise MadlibMopError(
            f"optimizer '{name}' is not a Keras optimizer",
            sqlstate=errors.INVALID_PARAMETER_VALUE, detail=f"Got: {text[:300]}",
            hint="Use one of " + ", ".join(sorted(OPTIMIZERS.values())) + ".")
    arguments = tuple(arguments)
    allowed = optimizer_parameters(canonical)
    for key, value in arguments:
        if OPTIMIZER_ALIASES.get(key, key) not in allowed | {DECAY}:
            raise MadlibMopError(
                f"{canonical} has no argument '{key}'",
                sqlstate=errors.INVALID_PARAMETER_VALUE, detail=f"Got: {text[:300]}",
                hint=f"{canonical} takes: " + ", ".join(sorted(allowed | {'lr', DECAY})) + ".")
        if not (value is None or isinstance(value, (bool, int, float))) or (
                isinstance(value, float) and not math.isfinite(value)):
            raise MadlibMopError(
                f"{canonical} argument {key}={value!r} is not a finite number, boolean or None",
                sqlstate=errors.INVALID_PARAMETER_VALUE, detail=f"Got: {text[:300]}",
                hint="Optimizer arguments are numbers, e.g. Adam(lr=0.001, beta_1=0.9).")
        check = OPTIMIZER_RANGES.get(OPTIMIZER_ALIASES.get(key, key))
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        # decay must be a number: True or None would not say which schedule.
        if check is not None and (number or key == DECAY) and not (number and check[0](value)):
            raise MadlibMopError(
                f"{canonical} argument {key}={value!r} is out of range: it must be {check[1]}",
                sqlstate=errors.INVALID_PARAMETER_VALUE, detail=f"Got: {text[:300]}",
                hint="decay is Keras 2's: lr / (1 + decay * iterations), e.g. Adam(lr=0.01, "
                     "decay=1e-4)." if key == DECAY
                else "e.g. Adam(lr=0.001); a learning rate is a positive number.")
    return Optimizer(canonical, arguments)


def optimizer_parts(text: str) -> tuple[str, list[tuple[str, Any]]]:
    """'Adam(lr=0.01)' -> ('Adam', [('lr', 0.01)]): literal values only, not checked
    against Keras (a client reads stored configurations without TensorFlow)."""
    what = "optimizer"
    try:
        node = ast.parse(str(text).strip(), mode="eval").body
    except SyntaxError as error:
        raise _syntax_error(what, str(text), error.msg) from None
    if isinstance(node, ast.Name):
        return node.id, []
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args \
            and all(k.arg is not None for k in node.keywords):
        return node.func.id, [(k.arg, _literal(k.value, what, str(text), False)) for k in node.keywords]
    raise _syntax_error(what, str(text), "expected Name or Name(key=value, ...), e.g. Adam(lr=0.01)")


def parse_optimizer(text: str) -> Optimizer:
    """'Adam(lr=0.01)', 'Adam()', 'adam' -> Optimizer."""
    name, arguments = optimizer_parts(text)
    return make_optimizer(name, arguments, str(text))


# ---- compile and fit parameters -----------------------------------------------------------------

@dataclass(frozen=True)
class CompileParams:
    optimizer: Optimizer
    loss: str
    metrics: tuple[str, ...] = ()
    extra: tuple[tuple[str, Any], ...] = ()  # loss_weights, weighted_metrics
    ignored: tuple[str, ...] = ()  # Keras 2 arguments given with their default (DROPPED_COMPILE_KEYS)

    def named(self) -> tuple[str, ...]:
        """The loss's and metrics' names (any of which an object table may hold)."""
        return (self.loss, *self.metrics)

    def __str__(self) -> str:
        parts = [f"optimizer='{self.optimizer}'", f"loss='{self.loss}'"]
        if self.metrics:
            parts.append(f"metrics={list(self.metrics)!r}")
        parts += [f"{key}={value!r}" for key, value in self.extra]
        return ",".join(parts)


def _check_name(value: Any, allowed: frozenset, kind: str, text: str,
                custom_names: Collection[str] | None) -> str:
    """A built-in name, or a custom function's (`custom_names`: the names an object table
    holds; None: any name, for configurations checked when they were made)."""
    built_in = isinstance(value, str) and (
        value in allowed or (kind == "metric" and TOP_K_ACCURACY.fullmatch(value)))
    if built_in or (isinstance(value, str) and (
            custom_names is None and value.isidentifier() or value in (custom_names or ()))):
        return value
    raise MadlibMopError(
        f"{kind} {value!r} is not supported",
        sqlstate=errors.INVALID_PARAMETER_VALUE, detail=f"Got: {text[:300]}",
        hint=f"Use a built-in Keras {kind}: " + ", ".join(sorted(allowed))
             + (", or top_<k>_accuracy (e.g. top_3_accuracy)" if kind == "metric" else "")
             + "; or a custom function loaded by load_custom_function(), with object_table => "
               "its table.")


def top_k(metric: str) -> int | None:
    """k of a top_<k>_accuracy metric, else None."""
    match = TOP_K_ACCURACY.fullmatch(metric)
    return int(match.group(1)) if match else None


def check_keys(params: dict, allowed: tuple, what: str, text: str) -> None:
    for key in params:
        if key not in allowed:
            raise MadlibMopError(
                f"{key} is not accepted in {what}",
                sqlstate=errors.INVALID_PARAMETER_VALUE, detail=f"Got: {text[:300]}",
                hint=f"{what} takes: " + ", ".join(allowed) + ".")


def compile_params_from(params: dict, text: str, custom_names: Collection[str] | None = ()) -> CompileParams:
    check_keys(params, COMPILE_KEYS, "compile_params", text)
    params = dict(params)
    ignored = []
    for key, default in DROPPED_COMPILE_KEYS.items():
        if key not in params:
            continue
        if params[key] is not default:
            raise MadlibMopError(f"compile_params: {key}={params[key]!r} is not supported",
                                 sqlstate=errors.FEATURE_NOT_SUPPORTED, detail=f"Got: {text[:300]}",
                                 hint=f"Keras 3 has no {key}; remove it (or pass {key}={default!r}, "
                                      "Keras 2's default, which changes nothing).")
        del params[key]
        ignored.append(key)
    if "loss" not in params:
        raise MadlibMopError("compile_params needs a loss", sqlstate=errors.INVALID_PARAMETER_VALUE,
                             detail=f"Got: {text[:300]}",
                             hint="Add e.g. loss='categorical_crossentropy'.")
    optimizer = params.get("optimizer", f"{DEFAULT_OPTIMIZER}()")
    optimizer = optimizer if isinstance(optimizer, Optimizer) else parse_optimizer(optimizer)
    loss = _check_name(params["loss"], LOSSES, "loss", text, custom_names)
    metrics = params.get("metrics", [])
    if isinstance(metrics, str):
        metrics = [metrics]
    if not isinstance(metrics, (list, tuple)):
        raise MadlibMopError("metrics must be a list, e.g. metrics=['accuracy']",
                             sqlstate=errors.INVALID_PARAMETER_VALUE, detail=f"Got: {text[:300]}",
                             hint="Pass one or more metric names in a list.")
    metrics = tuple(_check_name(m, METRICS, "metric", text, custom_names) for m in metrics)
    extra = tuple((k, params[k]) for k in ("loss_weights", "weighted_metrics") if k in params)
    for key, value in extra:
        if not isinstance(value, (list, dict)):
            raise MadlibMopError(f"{key} must be a list or dict",
                                 sqlstate=errors.INVALID_PARAMETER_VALUE,
                                 detail=f"Got: {text[:300]}", hint=f"e.g. {key}=[1.0]")
    return CompileParams(optimizer, loss, metrics, extra, tuple(ignored))


def parse_compile_params(text: str | None, custom_names: Collection[str] | None = ()) -> CompileParams:
    """Compile parameters; losses and metrics are built-in names, or names of `custom_names`
    (custom functions of an object table).  None: any name is taken as a custom function's,
    for configurations that were checked against their object table when they were made."""
    params = parse_keyword_text(text, "compile_params", names_are_strings=True,
                                call_keys=("optimizer",))
    return compile_params_from(params, text or "", custom_names)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_FIT_CHECKS = {
    "batch_size": (lambda v: _is_int(v) and v >= 1, "a positive integer"),
    "epochs": (lambda v: _is_int(v) and v >= 1, "a positive integer"),
    "verbose": (lambda v: _is_int(v) and 0 <= v <= 2, "0, 1 or 2"),
    "shuffle": (lambda v: isinstance(v, bool), "True or False"),
    "class_weight": (lambda v: isinstance(v, dict) and all(
        _is_int(k) and isinstance(w, (int, float)) and not isinstance(w, bool) for k, w in v.items()),
        "a dict {class index: weight}"),
    "initial_epoch": (lambda v: _is_int(v) and v >= 0, "a non-negative integer"),
    "steps_per_epoch": (lambda v: v is None or (_is_int(v) and v >= 1), "a positive integer or None"),
    "callbacks": (lambda v: isinstance(v, list) and all(isinstance(c, Callback) for c in v),
                  "a list of TensorBoard(...) calls"),
}
TENSORBOARD_HINT = ("TensorBoard callbacks are not run inside the database: `madlib-mop "
                    "tensorboard JOB --logdir DIR` writes TensorBoard event files from a "
                    "finished job's _info table.")


def fit_params_from(params: dict, text: str) -> dict[str, Any]:
    check_keys(params, FIT_KEYS, "fit_params", text)
    for key, value in params.items():
        check, expected = _FIT_CHECKS[key]
        if not check(value):
            raise MadlibMopError(f"fit_params {key}={value!r} must be {expected}",
                                 sqlstate=errors.INVALID_PARAMETER_VALUE,
                                 detail=f"Got: {text[:300]}", hint=f"Give {key} as {expected}.")
    for callback in params.get("callbacks", ()):
        if callback.name not in CALLBACKS:
            raise MadlibMopError(
                f"fit_params callback {callback.name} is not supported",
                sqlstate=errors.INVALID_PARAMETER_VALUE, detail=f"Got: {text[:300]}",
                hint="Remove it from fit_params; callbacks=[...] may only name "
                     + ", ".join(CALLBACKS) + ". " + TENSORBOARD_HINT)
    return dict(params)


def parse_fit_params(text: str | None) -> dict[str, Any]:
    """The fit parameters training uses.  TensorBoard callbacks (MADlib's docs pass them)
    are checked and left out: nothing runs them in the database (`fit_callbacks`)."""
    params = fit_params_from(parse_keyword_text(text, "fit_params"), text or "")
    params.pop("callbacks", None)
    return params


def fit_epochs(text: str | None) -> int:
    """fit_params' epochs: a model's passes over each segment per iteration."""
    return parse_fit_params(text).get("epochs", 1)


def fit_callbacks(text: str | None) -> list[Callback]:
    """The (TensorBoard) callbacks fit_params names, checked."""
    return fit_params_from(parse_keyword_text(text, "fit_params"), text or "").get("callbacks", [])


def fit_params_meaning(text: str | None) -> str:
    """What fit_params say, whatever the order of their keys: equal for equivalent texts."""
    params = fit_params_from(parse_keyword_text(text, "fit_params"), text or "")
    return fit_params_text(dict(sorted(params.items())))


def fit_params_text(params: dict[str, Any]) -> str:
    return ",".join(f"{key}={_render(value)}" for key, value in params.items())


def hyperparameters(compile_params: str | None, fit_params: str | None) -> dict[str, Any]:
    """The hyperparameters of one configuration as flat names: optimizer, its arguments (lr as
    learning_rate), loss, batch_size, epochs and the other fit keys with plain values.  Read
    from stored texts, not checked against Keras (a client has no TensorFlow)."""
    out: dict[str, Any] = {}
    if compile_params:
        params = parse_keyword_text(compile_params, "compile_params", names_are_strings=True,
                                    call_keys=("optimizer",))
        name, arguments = optimizer_parts(str(params.get("optimizer", "")))
        out["optimizer"] = name
        for key, value in arguments:
            out["learning_rate" if key in ("lr", "learning_rate") else key] = value
        out["loss"] = params.get("loss")
    if fit_params:
        for key, value in parse_keyword_text(fit_params, "fit_params").items():
            if isinstance(value, (int, float, str, bool)):
                out[key] = value
    return out


# ---- grids ------------------------------------------------------------------------------------

def _without_addresses(message: str) -> str:
    """Python names an AST node by its address ("<ast.Call object at 0x7f...>"): say which
    kind of node it is instead, so the message is the same every time."""
    return re.sub(r"<ast[.](\w+) object at 0x[0-9a-f]+>", r"a \1", message)


def parse_fit_grid(text: str | None) -> dict[str, list]:
    """A fit_params_grid.  MADlib writes a grid's callbacks as the text of the list,
    'callbacks': ['[TensorBoard(log_dir="/tmp/logs")]'] (or a list of such calls' texts):
    read here as the list of callbacks it names."""
    grid = parse_grid(text, "fit_params_grid")
    if "callbacks" in grid:
        grid["callbacks"] = [_grid_callbacks(value) for value in grid["callbacks"]]
    return grid


def _grid_callbacks(value: Any) -> Any:
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        value = "[" + ", ".join(value) + "]"
    if not isinstance(value, str):
        return value
    listed = value if value.strip().startswith("[") else f"[{value}]"
    return parse_keyword_text(f"callbacks={listed}", "fit_params_grid")["callbacks"]


def parse_grid(text: str | None, argument: str) -> dict[str, list]:
    """A grid: a Python dict literal (MADlib) or JSON object, every value a list."""
    if text is None or not text.strip():
        raise MadlibMopError(f"{argument} is empty", sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Pass a dict of lists, e.g. {'batch_size': [32, 64]}.")
    try:
        grid = json.loads(text)
    except ValueError:
        try:
            grid = ast.literal_eval(text.strip())
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as error:
            raise MadlibMopError(
                f"{argument} is not a dict literal", sqlstate=errors.SYNTAX_ERROR,
                detail=f"{type(error).__name__}: {_without_addresses(str(error))[:200]}. "
                       f"Got: {text[:300]}",
                hint="Write a Python dict literal or JSON object of lists, e.g. "
                     "{'loss': ['categorical_crossentropy'], 'metrics': ['accuracy']}; "
                     "names and calls are not allowed.") from None
    if not isinstance(grid, dict) or not grid:
        raise MadlibMopError(f"{argument} must be a non-empty dict", sqlstate=errors.SYNTAX_ERROR,
                             detail=f"Got: {text[:300]}",
                             hint="e.g. {'batch_size': [32, 64], 'epochs': [1]}")
    for key, values in grid.items():
        if not isinstance(key, str) or not isinstance(values, list) or not values:
            raise MadlibMopError(
                f"{argument}: the value of {key!r} must be a non-empty list",
                sqlstate=errors.INVALID_PARAMETER_VALUE, detail=f"Got: {text[:300]}",
                hint="Every key maps to a list of choices, e.g. 'epochs': [1, 2].")
    return grid


@dataclass(frozen=True)
class Config:
    model_id: int
    compile_params: str
    fit_params: str
