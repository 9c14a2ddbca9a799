"""Padding a batch to a graph batch size (torchair.inference.padding): the rule of vllm-ascend's
``graph_batch_sizes`` (smallest size >= the batch), masks and padded lengths, the refusal of a
batch larger than every size, split_batch, and that padded rows leave the real rows untouched."""
import pytest
import torch

import torchair.inference
from torchair.inference import PaddedBatch, graph_batch_size, pad_batch, split_batch

SIZES = [1, 2, 4, 8]


def test_exported_from_torchair_inference():
    for name in ("PaddedBatch", "graph_batch_size", "pad_batch", "split_batch"):
        assert name in torchair.inference.__all__
    assert torchair.inference.pad_batch is pad_batch
    assert torchair.inference.PaddedBatch is PaddedBatch


# ---- the rule


@pytest.mark.parametrize("batch", SIZES)
def test_exact_fit_pads_nothing(batch):
    padded = pad_batch(batch, SIZES)
    assert graph_batch_size(batch, SIZES) == batch
    assert (padded.batch, padded.size, padded.padding) == (batch, batch, 0)
    assert padded.mask.all() and padded.mask.shape == (batch,)
    t = torch.arange(batch * 3).reshape(batch, 3)
    assert padded.pad(t) is t


@pytest.mark.parametrize("batch,size", [(3, 4), (5, 8), (6, 8), (7, 8)])
def test_batch_between_sizes_takes_the_next_size(batch, size):
    assert graph_batch_size(batch, SIZES) == size
    padded = pad_batch(batch, SIZES)
    assert (padded.size, padded.padding) == (size, size - batch)


def test_unsorted_and_duplicate_sizes():
    sizes = [8, 2, 4, 2, 1, 8]
    for batch, size in [(1, 1), (2, 2), (3, 4), (5, 8), (8, 8)]:
        assert graph_batch_size(batch, sizes) == size
    assert graph_batch_size(3, (16, 4, 4)) == 4  # a tuple, unsorted, duplicated
    assert split_batch(20, [8, 2, 8]) == [8, 8, 4]


def test_single_size():
    assert graph_batch_size(1, [6]) == 6
    assert graph_batch_size(6, [6]) == 6
    assert pad_batch(2, [6]).padding == 4
    with pytest.raises(ValueError, match=r"\[6\]"):
        graph_batch_size(7, [6])


def test_batch_1_with_sizes_1():
    padded = pad_batch(1, [1], seq_lens=[5])
    assert (padded.size, padded.padding, padded.seq_lens) == (1, 0, [5])
    assert padded.mask.tolist() == [True]


def test_batch_larger_than_every_size_is_refused():
    for fn in (graph_batch_size, pad_batch):
        with pytest.raises(ValueError) as err:
            fn(9, [8, 1, 4, 2, 4])
        message = str(err.value)
        assert "[1, 2, 4, 8]" in message  # sorted, deduplicated
        assert "split_batch" in message
        assert "9" in message


@pytest.mark.parametrize("batch", [0, -1, True, False, 2.0, 1.5, "2", None])
def test_bad_batch(batch):
    with pytest.raises(ValueError, match="batch must be a positive int"):
        graph_batch_size(batch, SIZES)
    with pytest.raises(ValueError, match="batch must be a positive int"):
        pad_batch(batch, SIZES)
    with pytest.raises(ValueError, match="batch must be a positive int"):
        split_batch(batch, SIZES)


@pytest.mark.parametrize("sizes", [[], ()])
def test_empty_sizes(sizes):
    with pytest.raises(ValueError, match="graph_batch_sizes is empty"):
        graph_batch_size(1, sizes)


@pytest.mark.parametrize("sizes", [[1, 2.0], [0, 4], [-2, 4], [True, 4], [1, "4"], [1, None]])
def test_bad_size(sizes):
    for fn in (graph_batch_size, pad_batch, split_batch):
        with pytest.raises(ValueError, match="graph_batch_sizes must hold positive ints"):
            fn(1, sizes)


@pytest.mark.parametrize("sizes", ["1248", b"12", 8, None, {1, 2}])
def test_sizes_that_are_not_a_list(sizes):
    with pytest.raises(TypeError, match="graph_batch_sizes must be a list"):
        graph_batch_size(1, sizes)


# ---- split_batch


@pytest.mark.parametrize("sizes", [SIZES, [3], [8, 3, 5], [1]])
@pytest.mark.parametrize("batch", [1, 2, 3, 7, 8, 9, 16, 17, 25, 100])
def test_split_batch(batch, sizes):
    pieces = split_batch(batch, sizes)
    assert sum(pieces) == batch
    assert all(0 < p <= max(sizes) for p in pieces)
    assert all(p == max(sizes) for p in pieces[:-1])
    for piece in pieces:
        assert pad_batch(piece, sizes).batch == piece
    if batch <= max(sizes):
        assert pieces == [batch]


def test_split_batch_examples():
    assert split_batch(20, SIZES) == [8, 8, 4]
    assert split_batch(16, SIZES) == [8, 8]
    assert split_batch(3, SIZES) == [3]
    with pytest.raises(ValueError):
        split_batch(3, [])


# ---- seq_lens, pad_len


def test_seq_lens_padded_with_pad_len():
    assert pad_batch(3, SIZES, seq_lens=[7, 9, 11]).seq_lens == [7, 9, 11, 1]  # default 1
    assert pad_batch(3, SIZES, seq_lens=(7, 9, 11), pad_len=0).seq_lens == [7, 9, 11, 0]
    assert pad_batch(5, SIZES, seq_lens=[2] * 5, pad_len=3).seq_lens == [2] * 5 + [3] * 3
    assert pad_batch(3, SIZES, seq_lens=torch.tensor([7, 9, 11])).seq_lens == [7, 9, 11, 1]
    assert pad_batch(3, SIZES).seq_lens is None


def test_seq_lens_not_aliased():
    lens = [7, 9, 11]
    pad_batch(3, SIZES, seq_lens=lens)
    assert lens == [7, 9, 11]


@pytest.mark.parametrize("lens", [[1, 2], [1, 2, 3, 4], []])
def test_seq_lens_length_mismatch(lens):
    with pytest.raises(ValueError, match=f"seq_lens has {len(lens)} entries for a batch of 3"):
        pad_batch(3, SIZES, seq_lens=lens)


@pytest.mark.parametrize("pad_len", [-1, 1.0, True, "1"])
def test_bad_pad_len(pad_len):
    with pytest.raises(ValueError, match="pad_len must be an int >= 0"):
        pad_batch(3, SIZES, seq_lens=[1, 2, 3], pad_len=pad_len)
    with pytest.raises(ValueError, match="pad_len"):
        pad_batch(3, SIZES, pad_len=pad_len)  # checked without seq_lens too


# ---- mask


@pytest.mark.parametrize("batch", [1, 3, 5, 8])
def test_mask(batch):
    padded = pad_batch(batch, SIZES, device="cpu")
    assert padded.mask.dtype == torch.bool
    assert padded.mask.shape == (padded.size,)
    assert padded.mask.tolist() == [True] * batch + [False] * padded.padding
    assert padded.mask.device == torch.device("cpu")
    assert pad_batch(batch, SIZES, device=torch.device("cpu")).mask.device.type == "cpu"
    assert pad_batch(batch, SIZES, device="meta").mask.device.type == "meta"


# ---- PaddedBatch.pad


def test_pad_multi_dim_int_and_float():
    padded = pad_batch(3, SIZES)
    ints = torch.arange(3 * 2 * 5, dtype=torch.int32).reshape(3, 2, 5)
    out = padded.pad(ints)
    assert out.shape == (4, 2, 5) and out.dtype == torch.int32
    assert torch.equal(out[:3], ints) and torch.equal(out[3], torch.zeros(2, 5, dtype=torch.int32))
    out = padded.pad(ints, value=-7)
    assert torch.equal(out[3], torch.full((2, 5), -7, dtype=torch.int32))

    floats = torch.randn(3, 4, dtype=torch.float16)
    out = padded.pad(floats, value=2.5)
    assert out.shape == (4, 4) and out.dtype == torch.float16
    assert torch.equal(out[:3], floats) and torch.equal(out[3], torch.full((4,), 2.5).half())
    assert torch.equal(out[padded.mask], floats)

    lens = padded.pad(torch.tensor([7, 9, 11]), value=1)
    assert lens.tolist() == [7, 9, 11, 1] and lens.dtype == torch.int64


def test_pad_one_dim_and_several_padded_rows():
    padded = pad_batch(5, SIZES)
    out = padded.pad(torch.ones(5, dtype=torch.bool))
    assert out.tolist() == [True] * 5 + [False] * 3
    assert torch.equal(out, padded.mask)


@pytest.mark.parametrize("t", [torch.zeros(4, 2), torch.zeros(2, 2), torch.zeros(2, 3),
                               torch.tensor(3), torch.zeros(0, 3)])
def test_pad_refuses_the_wrong_rows(t):
    with pytest.raises(ValueError, match="expected a tensor with 3 rows"):
        pad_batch(3, SIZES).pad(t)


def test_pad_refuses_wrong_rows_even_without_padding():
    with pytest.raises(ValueError, match="expected a tensor with 4 rows"):
        pad_batch(4, SIZES).pad(torch.zeros(3))
    with pytest.raises(ValueError, match="0-d|\\(\\)"):
        pad_batch(1, [1]).pad(torch.tensor(1.0))


def test_pad_refuses_a_non_tensor():
    with pytest.raises(ValueError, match="list"):
        pad_batch(3, SIZES).pad([1, 2, 3])


def test_padding_property():
    assert pad_batch(3, SIZES).padding == 1
    assert pad_batch(5, SIZES).padding == 3
    assert pad_batch(8, SIZES).padding == 0
    assert PaddedBatch(batch=2, size=6, mask=torch.ones(6, dtype=torch.bool), seq_lens=None).padding == 4


# ---- a padded row leaves the real rows untouched


@pytest.mark.parametrize("garbage", [1e30, float("nan"), float("inf")])
def test_padded_rows_do_not_change_real_rows(garbage):
    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8)
    padded = pad_batch(3, SIZES)
    with torch.no_grad():
        clean = linear(padded.pad(x))
        dirty = linear(padded.pad(x, value=garbage))
    assert clean.shape == dirty.shape == (4, 4)
    assert not torch.equal(clean[~padded.mask], dirty[~padded.mask])  # the garbage did go in
    assert torch.equal(dirty[padded.mask], clean[padded.mask])
    assert torch.isfinite(dirty[padded.mask]).all()
