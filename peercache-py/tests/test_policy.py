"""The adapters' page policy, without sockets or engines (peercache.policy)."""

from peercache import policy


def test_the_leading_run_stops_at_the_first_hole():
    assert policy.leading([True, True, False, True]) == 2
    assert policy.leading([]) == 0
    assert policy.leading([False]) == 0


def test_the_last_prompt_token_is_never_loaded():
    # 4 full blocks of 32 tokens exactly: the engine must compute the last token itself.
    assert policy.loadable_blocks(128, 32, 4) == 3
    assert policy.loadable_blocks(129, 32, 4) == 4
    assert policy.loadable_blocks(129, 32, 2) == 2, "never past the hashed blocks"
    assert policy.loadable_blocks(1, 32, 0) == 0
    assert policy.loadable_blocks(100, 0, 3) == 0


def test_external_hits_count_only_what_the_engine_lacks():
    assert policy.external_hit_tokens(4, 32, 0) == 128
    assert policy.external_hit_tokens(4, 32, 64) == 64
    assert policy.external_hit_tokens(2, 32, 96) == 0


def test_a_load_fills_the_blocks_between_the_engines_own_and_the_hits_end():
    assert policy.load_range(64, 128, 32) == (2, 6)
    assert policy.load_range(0, 0, 32) == (0, 0)
    assert policy.load_range(64, 128 + 20, 32) == (2, 7), "a hit ending inside a block loads it"


def test_a_prompt_tail_is_a_page_only_after_a_full_block_and_with_two_tokens():
    assert policy.prompt_tail(100, 32, 3) == (3, 4)
    assert policy.prompt_tail(97, 32, 3) is None, "a 1-token tail is computed anyway"
    assert policy.prompt_tail(96, 32, 3) is None, "no tail"
    assert policy.prompt_tail(20, 32, 0) is None, "nothing keys a tail without a full block"
    assert policy.prompt_tail(100, 32, 2) is None, "the parent block has no hash yet"
    assert policy.prompt_tail(100, 0, 3) is None


def test_a_tail_hash_depends_on_the_parent_and_every_tail_token_and_is_never_a_block_hash():
    a = policy.tail_hash("ab" * 16, [1, 2, 3])
    assert a == policy.tail_hash("ab" * 16, [1, 2, 3]), "deterministic (no seed)"
    assert a != policy.tail_hash("cd" * 16, [1, 2, 3])
    assert a != policy.tail_hash("ab" * 16, [1, 2, 4])
    assert a != policy.tail_hash("ab" * 16, [1, 2])
    assert a.startswith("t") and len(a) == 33 and all(c in "0123456789abcdef" for c in a[1:])


def test_only_newly_full_hashed_blocks_are_published():
    assert policy.new_full_blocks(0, 100, 32, 10) == (0, 3)
    assert policy.new_full_blocks(3, 100, 32, 10) == (3, 3)
    assert policy.new_full_blocks(0, 320, 32, 4) == (0, 4), "a block without a hash waits"


def test_block_groups_cover_only_complete_leading_groups():
    # groups of 2 keys every 4 pages: group 0 = pages 0-1, group 1 = pages 4-5.
    present = [True, True, False, False, True, True, False, False]
    assert policy.leading_groups_cover(present, 2, 4) == 8
    present[5] = False
    assert policy.leading_groups_cover(present, 2, 4) == 4
    assert policy.leading_groups_cover([False] * 4, 1, 1) == 0


def test_a_trailing_window_restores_prefixes_whose_window_is_whole():
    present = [False, True, True, False, True]
    assert policy.trailing_restorable(present, 5, 2) == {3}
    assert policy.trailing_restorable(present, 5, 1) == {2, 3, 5}
    assert policy.trailing_restorable([True] * 3, 3, 8) == {1, 2, 3}
