"""``torchair demo --serve``: continuous batching padded to graph batch sizes, chunked prefill and
speculative decode generate, for every request, the tokens of that request generated alone in
eager (or differ only at a reported near tie), without a recompile after warm-up, with freed KV
blocks reused and never read by another request."""
import json
import os
import subprocess
import sys

import pytest
import torch

import torchair.demo
from torchair.demo import serve, serve_loop
from torchair.demo.kv_blocks import NULL_BLOCK, BlockPool

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["--serve", "--engine", "fx", "--layers", "1", "--hidden", "64", "--heads", "4",
        "--kv-heads", "2", "--vocab", "64", "--requests", "10", "--prompt-lens", "3", "40",
        "--output-lens", "4", "24", "--prefill-chunk", "16", "--max-batch", "4",
        "--graph-batch-sizes", "1", "2", "4", "--rounds", "1", "--no-progress"]


def _serve(tmp_path, *extra, code=0):
    path = tmp_path / "serve.json"
    got = torchair.demo.main([*TINY, *extra, "--json", str(path)])
    result = json.loads(path.read_text())
    assert got == code, (result["mismatches"], result["eager_check"]["mismatches"])
    return result


def _check_served(result, requests=10):
    assert result["all_tokens_equal"] and result["ok"]
    assert result["requests_exact"] + result["near_tie_divergences"] == requests
    assert result["mismatches"] == [] and result["eager_check"]["mismatches"] == []
    assert len(result["tokens"]) == len(result["reference_tokens"]) == requests
    for rid, tie in enumerate(result["near_ties"]):  # reported, with the gap that allowed it
        assert tie["gap"] <= serve.NEAR_TIE, (rid, tie)
    assert result["recompiles_after_warmup"] == 0
    stats = result["torchair"]["stats"]
    # requests joined and left: the live batch took several sizes, each run at a graph size
    assert len(stats["batch_sizes"]) >= 3, stats["batch_sizes"]
    assert set(map(int, stats["graph_sizes"])) <= {1, 2, 4}
    assert result["kv_blocks"]["reused"] > 0  # freed blocks were handed out again


@pytest.mark.parametrize("speculate", [0, 3])
def test_every_request_matches_itself_alone_in_eager(tmp_path, speculate, capsys):
    result = _serve(tmp_path, "--speculate", str(speculate), "--poison-freed")
    _check_served(result)
    out = capsys.readouterr().out
    assert "torchair (cached)" in out and "recompiles after warm-up" in out
    assert result["torchair"]["dynamo_compiles"] == 2  # decode (all gears) + prefill chunk
    decode, prefill = result["torchair"]["graphs"]  # one static unit per gear, and the chunk
    assert decode["build_static"] and prefill["build_static"] and decode["path"] == 4
    assert len(decode["built_gears"]) == 3 and "L_tokens_[0]=4" in decode["built_gears"][-1]
    assert prefill["built_gears"] == [] and prefill["path"] == 1  # every dim static
    assert out.count("built: static (path 4;") == 1 and out.count("built: static (path 1;") == 1
    spec = result["speculate"]
    assert spec["k"] == speculate
    assert result["padding_waste"] == result["torchair"]["padding_waste"] > 0
    assert result["eager"]["padding_waste"] == 0
    keys = {"all_tokens_equal", "requests_exact", "near_tie_divergences",
            "recompiles_after_warmup", "throughput_tokens_per_s", "padding_waste", "speculate"}
    assert keys <= set(result)
    assert set(result["throughput_tokens_per_s"]) == {"eager", "torchair"}
    if speculate:
        stats = result["torchair"]["stats"]
        assert "acceptance rate" in out and "tokens per step" in out
        assert spec["tokens_per_step"] > 1 and 0 < spec["acceptance_rate"] <= 1
        assert stats["accepted"] > 0
        # fewer than K drafts (none, too) went through the same compiled step: no recompile
        assert {0, 3} <= set(map(int, stats["drafts"])), stats["drafts"]
    else:
        assert spec["tokens_per_step"] == 1.0


def test_a_batch_larger_than_every_graph_size_is_split(tmp_path):
    result = _serve(tmp_path, "--max-batch", "6", "--graph-batch-sizes", "1", "2", "4")
    _check_served(result)
    assert max(map(int, result["torchair"]["stats"]["batch_sizes"])) == 4  # pieces of <= 4
    assert max(map(int, result["eager"]["stats"]["batch_sizes"])) > 4


def test_torch_compile_without_cache_compile_serves_too(tmp_path):
    result = _serve(tmp_path, "--no-cache-compile", "--speculate", "2")
    _check_served(result)


@pytest.mark.parametrize("argv, message", [
    (["--graph-batch-sizes", "2", "2"], "--graph-batch-sizes: give distinct positive sizes"),
    (["--graph-batch-sizes", "0", "4"], "--graph-batch-sizes: give distinct positive sizes"),
    (["--speculate", "-1"], "--speculate must be >= 0"),
    (["--prefill-chunk", "0"], "--prefill-chunk must be >= 1"),
    (["--requests", "0"], "--requests must be >= 1"),
    (["--prompt-lens", "9", "3"], "--prompt-lens 9 3: give MIN MAX with 1 <= MIN <= MAX"),
])
def test_serving_flags_are_checked(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        torchair.demo.main(["--serve", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


# ------------------------------------------------------------------------------ the loop itself

def _args(**kw):
    parser = torchair.demo.run._parser()
    args = parser.parse_args(TINY)
    for k, v in kw.items():
        setattr(args, k, v)
    torchair.demo.run._check_args(parser, args)
    return args


def _model(args):
    cfg = torchair.demo.model.DemoConfig(
        layers=args.layers, hidden=args.hidden, heads=args.heads, kv_heads=args.kv_heads,
        intermediate=args.intermediate, vocab=args.vocab, block_size=args.block_size,
        max_len=serve.max_positions(args))
    torch.manual_seed(args.seed)
    decoder = torchair.demo.model.Decoder(cfg).eval()
    return cfg, serve.ServeStep(decoder)


def _eager_runner(args, cfg, model, pool, graph_sizes=None):
    width = pool.blocks_for(serve.max_positions(args))
    return serve_loop.Runner("t", model.decode, model.prefill, pool,
                             query_len=1 + args.speculate, prefill_chunk=args.prefill_chunk,
                             table_width=width, graph_sizes=graph_sizes, device="cpu")


def _served_tokens(args, runner):
    reqs, stats, _ = serve_loop.serve(runner, serve.workload(args), max_batch=args.max_batch,
                                      speculate=args.speculate)
    return [r.generated for r in reqs], stats


@torch.no_grad()
def test_an_allocator_that_hands_out_a_held_block_is_caught(monkeypatch):
    """Negative control: two requests sharing a block must fail the token check."""
    args = _args(speculate=0)
    cfg, model = _model(args)
    ref = serve.reference(args, cfg, model.decoder, serve.workload(args), torch.float32)
    real_grow = BlockPool.grow

    def grow_sharing(self, rid, blocks, positions):
        if rid == 1 and len(blocks) == 1 and self.owner:  # request 1's second block: one held
            held = next(b for b, owner in self.owner.items() if owner != rid)
            blocks.append(held)
        real_grow(self, rid, blocks, positions)

    real_release = BlockPool.release
    monkeypatch.setattr(BlockPool, "grow", grow_sharing)
    monkeypatch.setattr(BlockPool, "release", lambda self, rid, blocks: real_release(
        self, rid, [b for b in blocks if self.owner.get(b) == rid]))  # the shared one stays
    pool = serve.make_pool(args, cfg, torch.float32)
    tokens, _ = _served_tokens(args, _eager_runner(args, cfg, model, pool))
    check = serve.check_tokens(tokens, ref)
    assert not check["all_tokens_equal"] and check["mismatches"]


@torch.no_grad()
def test_poison_catches_a_rollback_that_poisons_a_live_row(monkeypatch):
    """Negative control: poison mode turns a read of a dead row into a failed token check."""
    args = _args(speculate=3, poison_freed=True)
    cfg, model = _model(args)
    load = serve.workload(args)
    ref = serve.reference(args, cfg, model.decoder, load, torch.float32)
    real_shrink = BlockPool.shrink

    def shrink_one_early(self, rid, blocks, positions, written):  # off by one
        if written > positions:
            self._poison_rows(blocks, positions - 1, positions)
        real_shrink(self, rid, blocks, positions, written)

    monkeypatch.setattr(BlockPool, "shrink", shrink_one_early)
    pool = serve.make_pool(args, cfg, torch.float32)
    tokens, _ = _served_tokens(args, _eager_runner(args, cfg, model, pool))
    assert not serve.check_tokens(tokens, ref)["all_tokens_equal"]


def test_pool_frees_reuses_poisons_and_refuses_foreign_frees():
    cfg = torchair.demo.model.DemoConfig(layers=1, hidden=64, heads=4, kv_heads=2)
    pool = BlockPool(cfg, 4, "cpu", torch.float32, poison=True)
    a, b = [], []
    pool.grow(0, a, 20)  # two blocks of 16
    assert a == [1, 2] and NULL_BLOCK not in a and pool.in_use == 2
    pool.k[0][a[1]].fill_(1.0)
    pool.shrink(0, a, 16, 20)  # rows 16..19 rolled back: the whole second block goes
    assert a == [1] and pool.in_use == 1
    assert pool.k[0][2].isnan().all() and pool.v[0][2].isnan().all()
    pool.grow(1, b, 5)  # the freed block is the next one handed out
    assert b == [2] and pool.reused == 1 and pool.handed_out == 3
    pool.k[0][1].fill_(1.0)
    pool.shrink(0, a, 3, 9)  # rows 3..8 of block 1 poisoned, rows 0..2 kept
    assert pool.k[0][1][:3].eq(1).all() and pool.k[0][1][3:9].isnan().all()
    assert pool.k[0][1][9:].eq(1).all()
    with pytest.raises(RuntimeError, match="block 2 freed by request 0, which does not hold it"):
        pool.release(0, [2])
    pool.grow(0, a, 32)
    assert a == [1, 3] and not pool.free
    with pytest.raises(RuntimeError, match="KV cache out of blocks: request 1"):
        pool.grow(1, b, 40)
    assert pool.table_row([3, 1], 4) == [3, 1, NULL_BLOCK, NULL_BLOCK]
    assert pool.slot([3, 1], 17) == 1 * 16 + 1


@torch.no_grad()
def test_padded_rows_never_change_a_real_row(monkeypatch):
    """The same graph size with other garbage in the padded rows: real rows' logits and K/V
    identical, and no padded row writes outside the null block."""
    args = _args()
    cfg, model = _model(args)
    pool = serve.make_pool(args, cfg, torch.float32)
    runner = _eager_runner(args, cfg, model, pool, graph_sizes=[4])
    reqs = [serve_loop.Request(i, [5 + i, 7, 9, 11 + i], 4) for i in range(2)]
    for r in reqs:
        runner.prefill(r, len(r.prompt), serve_loop.Stats())
        r.cached = len(r.prompt)
        r.tokens.append(3)
    seen = []
    real_call = runner._call
    runner._call = lambda kind, fn, a: seen.append(a) or real_call(kind, fn, a)
    snapshot = [t.clone() for t in pool.k + pool.v]
    runner.decode(reqs, [[], []], serve_loop.Stats())
    clean = seen[-1]
    logits_clean = model.logits(*clean)[:2]
    after_clean = [t.clone() for t in pool.k + pool.v]
    for t, s in zip(pool.k + pool.v, snapshot):
        t.copy_(s)
    dirty = list(clean)
    for i, fill in ((0, 63), (1, 50)):  # garbage tokens / positions in the padded rows
        dirty[i] = clean[i].clone()
        dirty[i][2:] = fill
    dirty[5] = clean[5].clone()
    dirty[5][2:] = 7  # the padded rows attend over 7 positions of the null block, not 1
    logits_dirty = model.logits(*dirty)[:2]
    assert torch.equal(logits_clean, logits_dirty)
    for t, c in zip(pool.k + pool.v, after_clean):
        assert torch.equal(t[1:], c[1:])  # every block but the null block as in the clean run
    assert clean[2][2:].div(cfg.block_size, rounding_mode="floor").eq(NULL_BLOCK).all()
    assert clean[3][2:].eq(NULL_BLOCK).all()


def test_prompt_lookup_drafts():
    assert serve_loop.propose([1, 2, 3, 9, 1, 2, 3], 3) == [9, 1, 2]  # longest n-gram first
    assert serve_loop.propose([1, 2, 3, 9, 1, 2], 2) == [3, 9]
    assert serve_loop.propose([4, 5, 6], 3) == []  # the tail never occurred before
    assert serve_loop.propose([7, 7], 3) == [7]  # only what follows the match exists
    assert serve_loop.propose([1, 2, 1], 0) == []
    assert serve_loop.propose([1, 2, 9, 1, 5, 1], 1) == [5]  # the latest occurrence wins


def test_greedy_acceptance_takes_matching_drafts_then_the_model_token():
    r = serve_loop.Request(0, [1], 10)
    assert serve_loop._accept(r, [4, 5, 6], [4, 5, 8, 9]) == 2
    assert r.generated == [4, 5, 8]
    assert serve_loop._accept(r, [2], [3, 7]) == 0 and r.generated[-1] == 3
    assert serve_loop._accept(r, [], [6]) == 0 and r.generated[-1] == 6


def test_near_tie_rule():
    far = (0.5, 0)
    ref = [([1, 2, 3], [far] * 3), ([1, 2, 3], [far, (5e-5, 9), far]), ([1, 2], [far] * 2)]
    check = serve.check_tokens([[1, 2, 3], [1, 9, 4], [1, 2]], ref)
    assert check["all_tokens_equal"] and check["requests_exact"] == 2
    assert check["near_ties"] == [{"request": 1, "token": 1, "gap": 5e-5}]
    check = serve.check_tokens([[1, 2, 4], [1, 2, 3], [1, 2]], ref)  # a clear gap: a mismatch
    assert not check["all_tokens_equal"] and check["mismatches"][0]["request"] == 0
    # a near tie, but the served token is not the reference's runner-up
    assert not serve.check_tokens([[1, 2, 3], [1, 8, 4], [1, 2]], ref)["all_tokens_equal"]
    # a near tie at the first difference, but the request came out shorter
    assert not serve.check_tokens([[1, 2, 3], [1, 9], [1, 2]], ref)["all_tokens_equal"]
    assert not serve.check_tokens([[1, 2, 3], [1, 2, 3], [1]], ref)["all_tokens_equal"]
    with pytest.raises(ValueError, match="2 served requests for 3 references"):
        serve.check_tokens([[1, 2, 3], [1, 2, 3]], ref)


@torch.no_grad()
def test_the_served_step_is_the_demo_decoder_step():
    """ServeStep (FIA, S query tokens) against the reference's Decoder.logits (IFA, one token):
    the decode step's tokens exactly, a prefill chunk's logits to float32 rounding."""
    args = _args()
    cfg, model = _model(args)
    pools = [serve.make_pool(args, cfg, torch.float32) for _ in range(2)]
    blocks = [[], []]
    for pool, b in zip(pools, blocks):
        pool.grow(0, b, 40)
    width = pools[0].blocks_for(serve.max_positions(args))
    table = torch.tensor([pools[0].table_row(blocks[0], width)], dtype=torch.int32)
    prompt = torch.randint(0, args.vocab, (1, 21), generator=torch.Generator().manual_seed(3))
    slots = torch.tensor([[pools[0].slot(blocks[0], p) for p in range(21)]])
    one = []
    for p in range(21):  # the reference: one token at a time
        one.append(model.decoder.logits(prompt[:, p:p + 1], torch.tensor([p]), slots[:, p],
                                        table, [p + 1], pools[0].k, pools[0].v)[0, 0])
    chunk = model.logits(prompt, torch.arange(21)[None], slots, table, torch.tensor([21]),
                         torch.tensor([21]), pools[1].k, pools[1].v)[0]
    torch.testing.assert_close(chunk, torch.stack(one), rtol=1e-5, atol=1e-5)
    for a, b in zip(pools[0].k + pools[0].v, pools[1].k + pools[1].v):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)  # the same K/V rows written
    nxt = chunk[-1].argmax().view(1, 1)
    want = model.decoder(nxt, torch.tensor([21]), torch.tensor([pools[0].slot(blocks[0], 21)]),
                         table, [22], pools[0].k, pools[0].v)
    got = model.decode(nxt, torch.tensor([[21]]), torch.tensor([[pools[1].slot(blocks[1], 21)]]),
                       table, None, torch.tensor([22]), pools[1].k, pools[1].v)
    assert torch.equal(got, want)


def test_tp_ranks_that_disagree_stop_at_that_step(monkeypatch):
    from torchair.demo import serve_tp

    check = serve_tp._agreement(2, "cpu")

    def gather(out, mine):  # rank 1 saw other tokens
        out[0].copy_(mine)
        out[1].copy_(mine + 1)

    monkeypatch.setattr(serve_tp.dist, "all_gather", lambda out, t: [o.copy_(t) for o in out])
    check("decode", [[1, 2], [3, 4]])
    monkeypatch.setattr(serve_tp.dist, "all_gather", gather)
    with pytest.raises(RuntimeError, match="ranks disagree on the tokens of decode step 2"):
        check("decode", [[1, 2], [3, 4]])


def test_serve_tp2_ranks_agree_and_match_tp1(tmp_path):
    path = tmp_path / "tp.json"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TORCHAIR_DIST_TIMEOUT="60")
    argv = [a for a in TINY if a not in ("--engine", "fx")]
    done = subprocess.run([sys.executable, "-m", "torchair", "demo", *argv, "--tp", "2",
                           "--speculate", "2", "--device", "cpu", "--json", str(path)],
                          capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path,
                          check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("torchair demo --serve --tp 2:") == 1
    assert "the 2 ranks generated the same tokens: yes" in done.stdout
    result = json.loads(path.read_text())
    assert result["tp"] == 2 and result["ranks_agree"] and result["backend"] == "gloo"
    _check_served(result)
    assert result["model"]["tp"] == 2


@pytest.mark.inductor
def test_inductor_engine_serves_every_request_exactly(tmp_path):
    argv = [a for a in TINY if a not in ("--engine", "fx")]
    path = tmp_path / "serve.json"
    assert torchair.demo.main([*argv, "--graph-batch-sizes", "2", "4", "--speculate", "1",
                               "--json", str(path)]) == 0
    result = json.loads(path.read_text())
    _check_served(result)
    assert result["config"]["engine"] == "inductor"


def test_a_second_process_serves_warm_from_the_cache_dir(tmp_path):
    """vllm-ascend's use_cached_graph: the second process builds every gear from the entries
    the first wrote, without Dynamo, and still serves every request exactly."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    results = []
    for run in ("cold", "warm"):
        path = tmp_path / f"{run}.json"
        done = subprocess.run([sys.executable, "-m", "torchair", "demo", *TINY, "--speculate",
                               "2", "--cache-dir", str(tmp_path / "cache"), "--json", str(path)],
                              capture_output=True, text=True, timeout=240, env=env,
                              cwd=tmp_path, check=False)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        results.append(json.loads(path.read_text()))
    cold, warm = results
    assert cold["torchair"]["dynamo_compiles"] == 2 and warm["torchair"]["dynamo_compiles"] == 0
    assert len(cold["torchair"]["graphs"]) == 2
    for result in results:
        _check_served(result)
    assert warm["tokens"] == cold["tokens"]
    assert any((tmp_path / "cache").iterdir())
