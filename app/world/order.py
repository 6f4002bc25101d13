"""The order model: what a user's latest positives, in the order they came, say comes next.

order.npz holds a GRU (PyTorch's gate layout: reset, update, new) over item vectors of its
own, learnt by the world build on each history's positives in time order, and an output
vector per item:

- `inputs` (n_items x width): the vector an item feeds the GRU with;
- `weight_ih` (3·hidden x width), `weight_hh` (3·hidden x hidden), `bias_ih`, `bias_hh`
  (3·hidden each): the GRU's gates;
- `outputs` (n_items x hidden), `output_bias` (n_items): the next item's log-odds is
  output·state + bias. Both are stored less the catalog's mean, so a score is the item's
  log-odds over the average item's and an item added while serving (no vector) scores 0;
- `window` (an integer): how many of the latest positives it learnt to read; the service
  reads as many, whatever its own list holds (RECSYS_RECENT_ITEMS may be longer).

The service steps the state from zero through the user's latest positives (oldest first) on
every request, in process: a user's click reaches the next answer's state with no store in
between, and 20 steps of a few small products cost about 0.3 ms. The score is the `order`
sequence signal, weighed by pre-rank and the blend like the other signals. A world without
the file has no such signal; a schema that declares it needs the file (checked at start).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from app.core.errors import ConfigError
from app.core.vocabulary import Positions
from app.world.layout import ORDER_FILE
from app.world.stored import reading

FloatArray = npt.NDArray[np.float32]
ARRAYS = ("inputs", "weight_ih", "weight_hh", "bias_ih", "bias_hh", "outputs", "output_bias")
# A trained GRU's weights are a few units; values far past that come from a damaged or
# hand-made file and would overflow the state's float32 products into NaN.
MAX_MAGNITUDE = 1e4
MAX_WINDOW = 1_000


@dataclass(frozen=True, slots=True)
class Taste:
    """What the order model makes of one user's latest positives: its state, and the
    catalog's output vectors to score candidates against it."""

    state: FloatArray
    outputs: FloatArray
    output_bias: FloatArray

    def scores(self, positions: Positions) -> FloatArray:
        """Each candidate's log-odds of coming next over the average item's; 0 for an item
        the model does not know (one added while serving) and for every item when the user
        has no positives yet."""
        found = np.zeros(len(positions), dtype=np.float32)
        known = positions < len(self.outputs)
        at = positions[known]
        found[known] = self.outputs[at] @ self.state + self.output_bias[at]
        return found


NO_TASTE = Taste(
    np.zeros(0, dtype=np.float32),
    np.zeros((0, 0), dtype=np.float32),
    np.zeros(0, dtype=np.float32),
)


def _sigmoid(x: FloatArray) -> FloatArray:
    out: FloatArray = 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow warning for large |x|
    return out


@dataclass(frozen=True, slots=True)
class OrderModel:
    inputs: FloatArray
    weight_ih: FloatArray
    weight_hh: FloatArray
    bias_ih: FloatArray
    bias_hh: FloatArray
    outputs: FloatArray
    output_bias: FloatArray
    window: int

    @property
    def hidden(self) -> int:
        return int(self.weight_hh.shape[1])

    @property
    def items(self) -> int:
        return int(self.inputs.shape[0])

    def _read(self, recent: Positions) -> Positions:
        """What of `recent` (oldest first) the model reads: the latest `window` it knows."""
        known: Positions = recent[(recent >= 0) & (recent < self.items)][-self.window :]
        return known

    def state(self, recent: Positions) -> FloatArray:
        """The GRU's state after `recent` (oldest first), from zero; items it does not
        know are passed over."""
        return self._stepped(self._read(recent))

    def _stepped(self, known: Positions) -> FloatArray:
        hidden = self.hidden
        state = np.zeros(hidden, dtype=np.float32)
        if not len(known):
            return state
        # Every step's input gates in one product; only the state's part is sequential.
        gates_in = self.inputs[known] @ self.weight_ih.T + self.bias_ih
        for step in gates_in:
            gates_h = self.weight_hh @ state + self.bias_hh
            reset = _sigmoid(step[:hidden] + gates_h[:hidden])
            update = _sigmoid(step[hidden : 2 * hidden] + gates_h[hidden : 2 * hidden])
            new = np.tanh(step[2 * hidden :] + reset * gates_h[2 * hidden :])
            state = (1.0 - update) * new + update * state
        return state.astype(np.float32)

    def taste(self, recent: Positions) -> Taste:
        """What the model makes of `recent`: nothing where it knows none of them (the
        state it never learnt from, zero, would score every item by its bias alone)."""
        known = self._read(recent)
        if not len(known):
            return NO_TASTE
        return Taste(self._stepped(known), self.outputs, self.output_bias)


def taste_of(model: OrderModel | None, recent: Positions) -> Taste:
    """What `model` makes of `recent`; nothing where the world has no order model."""
    return NO_TASTE if model is None else model.taste(recent)


def save_order(world: Path, model: OrderModel) -> None:
    arrays = {name: getattr(model, name) for name in ARRAYS}
    np.savez(world / ORDER_FILE, window=np.int64(model.window), **arrays)


def _shapes_agree(arrays: dict[str, npt.NDArray[np.generic]], n_items: int) -> bool:
    inputs, weight_ih, weight_hh = arrays["inputs"], arrays["weight_ih"], arrays["weight_hh"]
    if inputs.ndim != 2 or weight_ih.ndim != 2 or weight_hh.ndim != 2:
        return False
    width, gates = inputs.shape[1], weight_ih.shape[0]
    hidden = weight_hh.shape[1]
    return (
        len(inputs) == n_items
        and hidden > 0
        and gates == 3 * hidden
        and weight_ih.shape == (gates, width)
        and weight_hh.shape == (gates, hidden)
        and arrays["bias_ih"].shape == (gates,)
        and arrays["bias_hh"].shape == (gates,)
        and arrays["outputs"].shape == (n_items, hidden)
        and arrays["output_bias"].shape == (n_items,)
    )


def load_order(world: Path, n_items: int, declared: bool) -> OrderModel | None:
    """The world's order model, or None when it has none; `declared`: its schema declares
    the order signal, which a world without the model cannot fill (every row's column 0,
    a signal the model and the blend weigh), so it is refused."""
    path = world / ORDER_FILE
    if not path.is_file():
        if declared:
            raise ConfigError(
                f"the schema declares the order signal but {world} has no {ORDER_FILE}: "
                "rebuild the world"
            )
        return None
    with reading(path), np.load(path) as stored:
        arrays = {name: stored[name] for name in ARRAYS}
        window = stored["window"]
    if any(array.dtype.kind != "f" for array in arrays.values()):
        raise ConfigError(f"{path} holds arrays that are not floats: rebuild the world")
    if not _shapes_agree(arrays, n_items):
        shapes = {name: array.shape for name, array in arrays.items()}
        raise ConfigError(f"{path} holds {shapes}, not a GRU over a catalog of {n_items} items")
    with np.errstate(over="ignore"):  # a float64 past float32's range: Inf, refused below
        served = {name: array.astype(np.float32) for name, array in arrays.items()}
    if not all(np.isfinite(array).all() for array in served.values()):
        raise ConfigError(f"{path} holds NaN, Inf or a value past float32's: rebuild the world")
    if any(array.size and np.abs(array).max() > MAX_MAGNITUDE for array in served.values()):
        raise ConfigError(
            f"{path} holds values past {MAX_MAGNITUDE:g}, no trained GRU's: rebuild the world"
        )
    if window.shape != () or window.dtype.kind not in "iu" or not 1 <= int(window) <= MAX_WINDOW:
        raise ConfigError(f"{path}: window must be one integer from 1 to {MAX_WINDOW}")
    return OrderModel(**served, window=int(window))
