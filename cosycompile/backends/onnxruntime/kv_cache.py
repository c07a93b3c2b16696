"""One graph input and output per layer's keys and values, instead of the stacked cache tensor.

The exported decode step takes the whole cache as one ``[L, 2, B, KVH, P, D]`` tensor and returns
it stacked again. ONNX Runtime cannot alias slices, so a step copies the cache four times: the
layer Split, the key/value Split, each layer's Concat with the new position, and the final stack
(a Reshape of a graph output is a fifth). On the 0.5B INT8 step those copies grow with the cache
and take a visible share of the step (docs/bench-log/2026-11-27-xeon-kv-cache-rewrite.md). With
per-layer inputs and outputs only the Concat copies, and a decoder that keeps the
per-layer arrays from one step to the next (:class:`KeptCacheDecoder`) never restacks them.

The rewrite proves which layer and which of key/value each per-layer Concat read by following its
slice back to the stacked input (Split + Squeeze or Gather on axis 0, twice), so a graph whose cache
is wired any other way is left as it is.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from cosycompile.backends.onnxruntime.graph_index import GraphIndex, attr, drop_unreachable

KV = ("k", "v")


def layer_names(name: str, layers: int) -> list[str]:
    """The per-layer tensors that replace the stacked ``name``: layer 0's k, layer 0's v, layer 1's k, ..."""
    return [f"{name}.{i}.{kv}" for i in range(layers) for kv in KV]


def _axis0_index(ix: GraphIndex, name: str) -> tuple[str, int] | None:
    """(source, i) when ``name`` is ``source[i]`` taken on axis 0 by a scalar Gather, or by a Split
    into size-1 pieces followed by a Squeeze of axis 0."""
    node = ix.producer.get(name)
    if node is None:
        return None
    if node.op_type == "Gather" and attr(node, "axis", 0) == 0:
        idx = ix.const(node.input[1])
        tensor = ix.initializer(node.input[1])
        # A scalar index drops the axis, as the Squeeze after a Split does; a [1] index keeps it.
        if idx is not None and len(idx) == 1 and tensor is not None and len(tensor.dims) == 0:
            return node.input[0], idx[0]
        return None
    if node.op_type != "Squeeze":
        return None
    split = ix.producer.get(node.input[0])
    if ix.axes(node) != [0] or split is None or split.op_type != "Split" or attr(split, "axis", 0) != 0:
        return None
    k = list(split.output).index(node.input[0])
    sizes = ix.const(split.input[1]) if len(split.input) > 1 and split.input[1] else attr(split, "split")
    if sizes is None or sizes[k] != 1:
        return None
    return split.input[0], sum(sizes[:k])


def _cache_slice(ix: GraphIndex, name: str) -> tuple[str, int, int] | None:
    """(stacked input, layer, 0 for keys / 1 for values) when ``name`` is ``input[layer, kv]``."""
    inner = _axis0_index(ix, name)
    outer = _axis0_index(ix, inner[0]) if inner else None
    if inner is None or outer is None:
        return None
    return outer[0], outer[1], inner[1]


def _stacked_piece(ix: GraphIndex, piece: str) -> tuple[Any, tuple[str, int, int]] | None:
    """(the layer's Concat, where its past comes from) when ``piece`` is Unsqueeze(axis 0) of a
    Concat(past slice, new positions)."""
    unsq = ix.from_op(piece, "Unsqueeze")
    if unsq is None:
        return None
    cat = ix.producer.get(unsq.input[0])
    if ix.axes(unsq) != [0] or cat is None or cat.op_type != "Concat" or len(cat.input) != 2:
        return None
    where = _cache_slice(ix, cat.input[0])
    return (cat, where) if where is not None else None


def split_kv_cache(model: Any) -> int:
    """Give ``model``'s stacked cache input and output one tensor per layer and key/value; returns
    the number of layers rewritten (0 when the graph does not have exactly that wiring)."""
    g = model.graph
    ix = GraphIndex(g)
    inputs = {i.name: i for i in g.input}
    for out in list(g.output):
        reshape = ix.producer.get(out.name)
        stack = ix.producer.get(reshape.input[0]) if reshape is not None and reshape.op_type == "Reshape" else None
        if stack is None or stack.op_type != "Concat" or attr(stack, "axis") != 0:
            continue
        pieces = [_stacked_piece(ix, p) for p in stack.input]
        # Piece j must read input[j // 2, j % 2] of one stacked input: the order the names promise.
        sources = {p[1][0] for p in pieces if p is not None}
        if (pieces and len(pieces) % 2 == 0 and len(sources) == 1 and sources <= inputs.keys()
                and all(p is not None and p[1][1:] == divmod(j, 2) for j, p in enumerate(pieces))):
            return _rewire(model, ix, inputs[sources.pop()], out, [p[0] for p in pieces if p is not None])
    return 0


def _only_sliced(ix: GraphIndex, past: str, concats: list[Any]) -> bool:
    """Whether ``past`` feeds nothing but Shape and the slices that end as the per-layer Concats'
    first input: otherwise removing it would leave a reader without its input."""
    ends = {id(c) for c in concats}
    todo = [past]
    while todo:
        tensor = todo.pop()
        for user in ix.consumers.get(tensor, []):
            if tensor == past and user.op_type == "Shape":
                continue
            if user.input[0] != tensor or tensor in user.input[1:]:
                return False
            if id(user) not in ends:
                if user.op_type not in ("Split", "Squeeze", "Gather"):
                    return False
                todo.extend(user.output)
    return True


def _rewire(model: Any, ix: GraphIndex, past: Any, present: Any, concats: list[Any]) -> int:
    from onnx import helper, numpy_helper

    g = model.graph
    layers = len(concats) // 2
    dims = [d.dim_value or d.dim_param for d in past.type.tensor_type.shape.dim]
    if len(dims) != 6 or dims[0] != layers or dims[1] != 2 or not _only_sliced(ix, past.name, concats):
        return 0
    # Besides the slices, the stacked input may only feed Shape (the step reads the past length).
    shapes = [n for n in ix.consumers.get(past.name, []) if n.op_type == "Shape"]
    if any(attr(n, "start") not in (None, 0) or attr(n, "end") is not None for n in shapes):
        return 0
    in_names, out_names = layer_names(past.name, layers), layer_names(present.name, layers)
    elem = past.type.tensor_type.elem_type
    for cat, pin, pout in zip(concats, in_names, out_names):
        cat.input[0] = pin
        # Renaming the Concat's output to the graph output's name makes the Concat write it directly.
        for user in ix.consumers.get(cat.output[0], []):
            for k, name in enumerate(user.input):
                if name == cat.output[0]:
                    user.input[k] = pout
        cat.output[0] = pout
    extra = []
    for n in shapes:
        # [L, 2] + the shape of layer 0's keys is the stacked shape, so every reader of it is unchanged.
        head = f"{n.output[0]}.layers"
        g.initializer.append(numpy_helper.from_array(np.array([layers, 2], np.int64), head))
        inner = f"{n.output[0]}.layer0"
        extra.append((n, [helper.make_node("Shape", [in_names[0]], [inner], name=f"{n.name}.layer0"),
                          helper.make_node("Concat", [head, inner], [n.output[0]], axis=0, name=f"{n.name}.stacked")]))
    for n, repl in extra:
        pos = list(g.node).index(n)
        g.node.remove(n)
        for k, r in enumerate(repl):
            g.node.insert(pos + k, r)
    g.input.remove(past)
    g.input.extend(helper.make_tensor_value_info(n, elem, dims[2:4] + ["past"] + dims[5:]) for n in in_names)
    pos = list(g.output).index(present)
    g.output.remove(present)
    for k, n in enumerate(out_names):
        g.output.insert(pos + k, helper.make_tensor_value_info(n, elem, dims[2:4] + ["total"] + dims[5:]))
    drop_unreachable(g)
    return layers


class PerLayerCache:
    """Stacked-cache calls over a graph with per-layer cache inputs and outputs.

    ``run`` keeps the Runner contract (the stacked tensors in and out): the layer views of a
    contiguous ``[L, 2, ...]`` array are themselves contiguous, so only the outputs are restacked.
    ``decoder()`` skips even that by keeping the per-layer arrays from step to step.
    """

    def __init__(self, run: Callable[[dict[str, np.ndarray]], list[np.ndarray]], output_names: list[str],
                 cache_in: str, cache_out: str, layers: int) -> None:
        self._run = run
        self.output_names = output_names
        self.cache_in, self.cache_out, self.layers = cache_in, cache_out, layers
        self.in_names = layer_names(cache_in, layers)
        self.out_names = layer_names(cache_out, layers)

    def feeds(self, feeds: dict[str, np.ndarray], cache: list[np.ndarray]) -> dict[str, np.ndarray]:
        out = {k: v for k, v in feeds.items() if k != self.cache_in}
        out.update(zip(self.in_names, cache))
        return out

    def split(self, stacked: np.ndarray) -> list[np.ndarray]:
        stacked = np.ascontiguousarray(stacked)
        return [stacked[i, j] for i in range(self.layers) for j in range(2)]

    def call(self, feeds: dict[str, np.ndarray], cache: list[np.ndarray]) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
        """The graph's other outputs by name, and the new per-layer cache."""
        outs = dict(zip(self.output_names, self._run(self.feeds(feeds, cache))))
        present = [outs.pop(n) for n in self.out_names]
        return outs, present

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outs, present = self.call(feeds, self.split(feeds[self.cache_in]))
        outs[self.cache_out] = np.stack(present).reshape(self.layers, 2, *present[0].shape)
        return outs


class KeptCacheDecoder:
    """One-token decode steps over a per-layer cache kept between steps (the decoder protocol the
    pipeline's ``LLMRuntime.decoding`` uses: ``fits``, ``start``, ``step``)."""

    def __init__(self, cache: PerLayerCache, embeds_name: str, logits_name: str) -> None:
        self.cache = cache
        self.embeds_name, self.logits_name = embeds_name, logits_name
        self.present: list[np.ndarray] | None = None

    def fits(self, positions: int) -> bool:
        """Always: the cache grows with the utterance, as the stacked step's does."""
        return True

    def start(self, present: np.ndarray, max_new: int) -> None:
        """Take a prefill's present cache [L, 2, B, KVH, P, D]."""
        self.present = self.cache.split(present)

    def step(self, embeds: np.ndarray) -> np.ndarray:
        """Logits [B, 1, V] of one token whose input embedding is ``embeds`` [B, 1, H]."""
        if self.present is None:
            raise RuntimeError("start() the decoder with a prefill cache first")
        outs, self.present = self.cache.call({self.embeds_name: embeds}, self.present)
        return outs[self.logits_name]
