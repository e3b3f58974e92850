"""Re-run the mutation table of tests/README.md: apply each one-line change, run the test that must
catch it, expect it red, restore the file (issue 30).

    COMFYUI_PATH=/work/env/c029 /work/env/v029/bin/python tests/mutations.py          # all
    /work/main/.venv/bin/python tests/mutations.py --pure                           # no ComfyUI
    python tests/mutations.py --only 3,7                                            # by number

Run from the repository root, on a clean tree (each file is restored byte for byte, also on
Ctrl+C). A mutation whose test is marked ``comfy`` runs only where ``COMFYUI_PATH`` is set. Exit
status 1 if any mutation survived (its test passed) or could not be applied.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_ORDER = "tests/test_cluster_order.py::test_every_process_posts_its_collectives_in_one_common_order"
_SYNCS = "tests/test_dist_exchange.py::test_the_gloo_path_waits_on_the_host_once_per_exchange_call"
_TE = "tests/test_text_encoder_split_comfy.py::"
_LTX = "tests/test_ltx2_sequence_comfy.py::test_ltx2_sequence_matches_core"
_AV_TOY = "tests/test_sequence_families.py::test_video_split_audio_whole_like_the_whole_pair"
_RESIDENT_PEAK = "tests/test_resident_fake_gpu.py::test_resident_counts_follow_free_memory_and_the_peak_stays_within"
_GIVE_BACK = "tests/test_resident_give_back_comfy.py::"
_PIPE = "tests/test_sequence_pipeline.py::"
_OVERLAP = "tests/test_cost_overlap.py::"
CLUSTER = "cluster"
"""Its test starts a local Ray cluster (needs Ray: requirements-cluster.txt)."""
# (file, exact text, its mutation, test node id, needs ComfyUI: True, False or CLUSTER)
MUTATIONS = [
    ("parallel/sequence/ops.py", "if torch.cuda.is_available() and nbytes:", "if False:",
     "tests/test_cuda_paths_on_cpu.py::test_bounce_buffers_are_page_locked_and_exactly_the_bytes_held", False),
    ("parallel/sequence/ops.py",
     'return self.pin and self.is_async(dst_place) and t.device.type == "cpu" and not t.is_pinned()',
     "return False",
     "tests/test_cuda_paths_on_cpu.py::test_a_pageable_owner_needs_a_bounce_to_a_gpu_and_nothing_else_does", False),
    ("parallel/sequence/stream.py", "buf.used = self.ops.record(self.ops.current_stream(self.place))",
     "buf.used = None",
     "tests/test_stream_order.py::test_order_rules_hold_and_numerics_match_the_plain_ring", False),
    ("parallel/sequence/threads.py", "for stream in sorted(self.streams, key=lambda st: st.device == device):",
     "for stream in ():",
     "tests/test_cuda_paths_on_cpu.py::test_rank_threads_run_on_the_main_threads_stream", False),
    ("parallel/sequence/ops.py", "side.wait_stream(stream)", "pass",
     "tests/test_cuda_paths_on_cpu.py::test_a_copy_from_another_gpu_waits_for_the_rings_stream", False),
    ("parallel/distributed/weights.py", "slot.copied.synchronize()\n        slot.index", "pass\n        slot.index",
     "tests/test_cuda_paths_on_cpu.py::test_a_weight_ring_slot_is_refilled_only_after_the_copy_reading_it", False),
    ("parallel/distributed/weights.py", "slot.copied.synchronize()\n        self._slots.clear()",
     "pass\n        self._slots.clear()",
     "tests/test_cuda_paths_on_cpu.py::test_a_weight_ring_slot_is_refilled_only_after_the_copy_reading_it", False),
    # (8, 9 were the lobby's HMAC checks; the lobby is gone, issue 32: Ray's calls carry the payloads)
    ("parallel/distributed/protocol.py", "    if nbytes != len(payload) - _LEN - n:\n", "    if False:\n",
     "tests/test_dist_protocol.py::test_a_payload_round_trips_bit_for_bit_and_refuses_every_malformed_one", False),
    ("parallel/distributed/protocol.py", "    if nbytes > max_body:\n", "    if False:\n",
     "tests/test_dist_protocol.py::test_an_oversized_tensor_description_is_refused_before_allocation", False),
    ("parallel/distributed/serving.py", "or flat.dtype != torch.uint8 or flat.numel() != self.layouts[(key, idx)].nbytes:",
     "or flat.dtype != torch.uint8:",
     "tests/test_dist_protocol.py::test_a_worker_refuses_owned_weights_that_do_not_fill_the_layout_exactly", False),
    ("parallel/distributed/wire.py", "if offset != data.numel():", "if False:",
     "tests/test_dist_protocol.py::test_received_bytes_must_be_exactly_what_was_expected", False),
    ("parallel/cost/memory.py", "(f.ulysses * share * (g - 1) / g if g > 1", "(f.ulysses * 0.7 * share * (g - 1) / g if g > 1",
     "tests/test_memory_plan_fake_gpu.py::test_the_plans_ulysses_term_bounds_the_exchange_measured", True),
    ("loaders/comfy/shard/hooks.py", "key: value[c0:c1] if key in _CHUNK_LISTS",
     "key: value[chunks - c1:chunks - c0] if key in _CHUNK_LISTS",
     "tests/test_sequence_lean_comfy.py::test_lean_sequence_matches_batched_and_core", True),
    ("loaders/comfy/vae/tiled_decode.py", "model.decode(a.to(dtype).to(device)).to(dtype=out_dtype)",
     "model.decode(a.to(dtype).to(device))",
     "tests/test_vae_decode_av_comfy.py::test_tiles_cast_to_core_output_dtype", True),
    # the fixes of issue 30 part 1, each undone
    ("parallel/sequence/stream.py", "dm.__dict__.pop(attr, None)", "pass",
     "tests/test_stream_order.py::test_a_reused_buffer_carries_only_its_own_blocks_patches", False),
    ("parallel/sequence/stream.py", "dm.__dict__.pop(attr, None)", "pass",
     "tests/test_sequence_comfy.py::test_streamed_blocks_with_a_lora_on_some_blocks_match_core", True),
    ("parallel/sequence/stream.py", "memo[id(m.__dict__[attr])] = m.__dict__[attr]", "pass",
     "tests/test_stream_order.py::test_a_reused_buffer_carries_only_its_own_blocks_patches", False),
    ("parallel/sequence/threads.py", "            task.fn = None\n", "",
     "tests/test_sequence.py::test_a_finished_forward_keeps_no_rank_rows_alive_between_steps", False),
    ("parallel/sequence/threads.py", "            task = None\n", "",
     "tests/test_sequence.py::test_a_rank_thread_drops_a_finished_tasks_result", False),
    # gpu_check's findings (issue 30 part 4) fixed in the ring
    ("parallel/sequence/stream.py", "self.ops.needs_bounce(t, self.place) for t in src]",
     "self.ops.needs_bounce(src[0], self.place) for t in src]",
     "tests/test_stream_order.py::test_the_bounce_is_decided_per_tensor", False),
    ("parallel/sequence/stream.py", '"pinned": sum(b.flat.numel()', '"pinned": sum(b.flat.numel() // 2',
     "tests/test_stream_order.py::test_the_bounce_is_decided_per_tensor", False),
    ("benchmarks/gpu_check_sections.py", "factors=factors if factors is not None else toy_factors())",
     "factors=factors)", "tests/test_gpu_check_dry.py::test_the_memory_sections_plan_holds_the_toys_tracked_peak",
     False),
    # issue 31 part 2, platform items: hidden GPUs (Windows), aimdo's memory, pinned memory, fast_disk clones
    ("parallel/placement/devices.py", "hidden = f\" {hidden_note}\" if hidden_note else \"\"",
     "hidden = \"\"", "tests/test_hidden_gpus_and_core_memory.py::"
     "test_a_missing_device_error_names_the_hidden_gpus_and_the_fix", False),
    ("parallel/placement/planner.py", "existing, inventory.hidden_note)", "existing)",
     "tests/test_hidden_gpus_and_core_memory.py::"
     "test_the_planner_names_hidden_gpus_for_a_missing_device_and_a_dit_that_does_not_fit", False),
    ("parallel/placement/plan_text.py", "    if not note:\n        return \"\"\n", "    return \"\"\n",
     "tests/test_hidden_gpus_and_core_memory.py::"
     "test_the_planner_names_hidden_gpus_for_a_missing_device_and_a_dit_that_does_not_fit", False),
    ("parallel/placement/inventory.py", "return self.free_bytes + self.held_bytes + self.releasable_bytes",
     "return self.free_bytes + self.held_bytes",
     "tests/test_hidden_gpus_and_core_memory.py::test_memory_comfyui_can_release_is_available_to_the_planner", False),
    ("parallel/sequence/ops.py", "return self.pin and self.is_async(dst_place)", "return self.is_async(dst_place)",
     "tests/test_hidden_gpus_and_core_memory.py::test_the_ring_bounces_through_pinned_memory_only_when_allowed", False),
    ("loaders/comfy/loading/model_loading.py",
     "check_devices_exist(parsed.unique_devices, inventory.names, inventory.hidden_note)",
     "check_devices_exist(parsed.unique_devices, inventory.names)",
     "tests/test_hidden_gpus_comfy.py::test_node_errors_name_the_hidden_gpus_and_cuda_device_all", True),
    ("loaders/comfy/shard/which_devices.py", "    _say_hidden(chosen, inventory)\n", "",
     "tests/test_hidden_gpus_comfy.py::test_auto_says_it_chose_from_the_one_gpu_shown", True),
    ("loaders/comfy/core/component_placement.py", "return with_releasable(inventory.with_held_bytes(held))",
     "return inventory.with_held_bytes(held)",
     "tests/test_hidden_gpus_comfy.py::test_placement_counts_the_vram_aimdo_holds_for_comfyui", True),
    ("loaders/comfy/shard/pipeline.py", "    sync_pinned_memory()  #", "    pass  #",
     "tests/test_core_settings_comfy.py::test_the_ring_follows_disable_pinned_memory", True),
    ("loaders/comfy/shard/pipeline.py", "    model = clonable(model)", "    pass",
     "tests/test_core_settings_comfy.py::test_a_patcher_subclass_without_fast_disk_shards_and_clones", True),
    ("loaders/comfy/core/running_state.py", 'if args is None or not hasattr(args, "disable_cuda_graphs"):', "if True:",
     "tests/test_selftest_comfy.py::test_selftest_switches_set_cores_own_or_say_it_has_none", True),
    ("loaders/cli/selftest/switches.py", '        lines.append(note)', "        pass",
     "tests/test_selftest_comfy.py::test_cpu_selftest_passes_with_full_report", True),
    ("loaders/comfy/core/running_state.py", "    return _aimdo_bytes(index) + _torch_cached_bytes(index)",
     "    return _aimdo_bytes(index)",
     "tests/test_hidden_gpus_comfy.py::test_releasable_memory_adds_torchs_cached_blocks", True),
    # issue 30 fix 5: one order of every process's collectives, one host sync per exchange call
    ("parallel/distributed/order.py", "        if phase == EXCHANGE:\n", "        if False:\n",
     _ORDER, CLUSTER),
    ("parallel/distributed/order.py", "self._wait(lambda: all(f >= step - 1 for f in self._finished.values()),",
     "self._wait(lambda: True,", _ORDER, CLUSTER),
    ("parallel/distributed/order.py", "        if phase == EXCHANGE:\n",
     "        self._last = (-1, EXCHANGE)  # the order's own check made blind too\n        if False:\n", _ORDER, CLUSTER),
    ("parallel/distributed/wire.py", "        offset += raw.numel()\n",
     "        offset += raw.numel()\n        if staged:\n            host_sync(_record(raw.device))\n", _SYNCS, False),
    ("parallel/distributed/wire.py", "data = _host_buffer(sum(sizes), True)", "data = _host_buffer(sum(sizes), False)",
     _SYNCS, False),
    ("parallel/distributed/wire.py", "return _host_buffer(nbytes, any(_on_gpu(d) for d in local_devices))",
     "return _host_buffer(nbytes, False)", _SYNCS, False),
    ("parallel/distributed/wire.py", "raws.append(t.detach().contiguous().reshape(-1).view(torch.uint8))",
     "raws.append(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8))", _SYNCS, False),
    ("parallel/sequence/local.py", "        rank.stream.done_with(module, index)\n",
     "        rank.stream.done_with(module, index)\n        torch.zeros(1).item()\n",
     "tests/test_dist_exchange.py::test_the_local_path_has_no_host_sync", False),
    # issue 33 item 3: text encoders over several devices
    ("parallel/blocks/layer_devices.py", "return map_tensors(lambda t: t.to(source), output)", "return None",
     "tests/test_text_encoder_split.py::test_layers_on_fake_gpus_run_there_and_hand_back_to_home", False),
    ("parallel/placement/layer_split.py", 'return fit + ["cpu"]', 'return ["cpu"]',
     "tests/test_text_encoder_split.py::test_auto_fills_the_gpus_before_the_cpu", False),
    ("loaders/comfy/loading/text_encoder_split.py", 'for word in ("vision", "visual")', 'for word in ("nothing",)',
     _TE + "test_split_over_cpus_encodes_as_core", True),
    ("loaders/comfy/loading/component_loading.py",
     'split = chosen == "cpu" and str(device).strip().lower() == "auto" and bool(inventory.gpus)', "split = False",
     _TE + "test_auto_splits_by_free_memory_gpu_before_cpu", True),
    ("loaders/comfy/loading/text_encoder_split.py", "g.available_bytes - reserve - loads", "g.available_bytes - loads",
     _TE + "test_auto_splits_by_free_memory_gpu_before_cpu", True),
    ("loaders/plan/text_encoders.py", 'split = None if split is None or split.devices == ("cpu",) else split', "split = None",
     _TE + "test_plan_shows_h3s_encoder_over_the_gpus_and_its_time", True),
    ("loaders/comfy/loading/text_encoder_split.py",
     "clip.patcher.add_callback_with_key(comfy.patcher_extension.CallbacksMP.ON_LOAD, CALLBACK_KEY, place)", "pass",
     _TE + "test_the_split_is_put_back_after_each_comfyui_load", True),
    ("loaders/comfy/loading/text_encoder_split.py", "run_tokens_on(model, torch.device(split.home))", "pass",
     _TE + "test_tokens_are_embedded_on_the_first_device_not_the_load_device", True),
    # issue 33 item 2: LTX-2.3 in sequence
    ("parallel/families.py", 'gather_kv=("video_to_audio_attn",), must_be_none', 'gather_kv=(), must_be_none', _LTX, True),
    ("parallel/families.py", '(("x",),), token_specs=_LTXAV_TOKENS,', '(("x",),), token_specs=None,', _LTX, True),
    ("parallel/sequence/ulysses.py", "    return torch.cat([recv[j][0] for j in range(n)], dim=hdim)",
     "    return torch.cat([recv[j][0] for j in reversed(range(n))], dim=hdim)", _LTX, True),
    ("parallel/sequence/ulysses.py", "full = [torch.cat([recv[j][i] for j in range(n)], dim=tok) for i in (0, 1)]",
     "full = [torch.cat([recv[j][i] for j in (range(n) if i else reversed(range(n)))], dim=tok) for i in (0, 1)]",
     _AV_TOY, False),
    ("parallel/sequence/engine.py",
     '| {f"{n}.{i}" for s in self.token_specs for n, items in s.whole_parts.items() for i in items})', "| set())",
     _AV_TOY, False),
    ("parallel/sequence/engine.py", "if spec.gather_kv and not isinstance(self.runner, LocalRanks):", "if False:",
     "tests/test_sequence_families.py::test_cross_modal_heads_over_worker_processes_run_whole", False),
    ("parallel/sequence/frames.py", "cut.offset, cut.length = t0 - f0 * per, t1 - t0", "cut.offset, cut.length = 0, t1 - t0",
     _AV_TOY, False),
    ("parallel/sequence/frames.py", "new.data, new.num_frames = data[:, f0:f1], f1 - f0",
     "new.data, new.num_frames = data[:, :f1 - f0], f1 - f0", _AV_TOY, False),
    ("parallel/sequence/frames.py", "return tuple(t.narrow(1, self.offset, self.length).contiguous()",
     "return tuple(t.narrow(1, 0, self.length).contiguous()",
     "tests/test_ltx2_sequence_comfy.py::test_per_frame_timesteps_cut_like_the_whole", True),
    ("parallel/cost/memory.py", '"ltxav": ActivationFactors(block=14.75,', '"ltxav": ActivationFactors(block=13.0,',
     "tests/test_memory_plan_fake_gpu.py::test_sequence_peak_within_ten_percent_of_plan[ltx-2.3-480p-2-cfg6]", True),
    ("parallel/sequence/rank_block.py", "self._by_module = self._self_module is not None and watch is not None",
     "self._by_module = False", "tests/test_ltx2_sequence_comfy.py::test_ltx2_with_cores_stg_in_sequence_matches_core",
     True),
    # issue 34: resident blocks priced, given back first, re-decided per prompt
    ("parallel/cost/model.py", "and d != owner and i not in kept[d]", "and d != owner",
     "tests/test_resident_cost.py::test_every_block_resident_streams_nothing_and_is_priced_so", False),
    ("parallel/cost/resident.py", "if owner != device and int(nbytes) <= left:", "if int(nbytes) <= left:",
     "tests/test_resident_cost.py::test_the_rule_keeps_what_the_ring_keeps", False),
    ("parallel/cost/mode.py", "costs = estimate_costs(work, hw, owned, resident=resident, pipelined=piped)",
     "costs = estimate_costs(work, hw, owned, pipelined=piped)", "tests/test_resident_cost.py::test_auto_prices_the_blocks_each_rank_keeps",
     False),
    ("parallel/cost/rows.py",
     'costs["sequence"] = estimate(work, hw, seq.counts, weighted=weighted, resident=seq.kept,',
     'costs["sequence"] = estimate(work, hw, seq.counts, weighted=weighted,',
     "tests/test_resident_plan_comfy.py::test_fp8_every_block_resident_streams_nothing", True),
    ("loaders/comfy/shard/resident_budgets.py", "info.free_bytes + info.releasable_bytes - r.activations - ring_to_come",
     "info.free_bytes + info.releasable_bytes - ring_to_come", _RESIDENT_PEAK, True),
    ("parallel/sequence/stream.py", "_nbytes(_block_tensors(block)) > self.resident_budget:",
     "_nbytes(_block_tensors(block)) > 2 * self.resident_budget:", _RESIDENT_PEAK, True),
    ("loaders/comfy/shard/auto_mode.py", "key = (*shape, lean, budgets)", "key = (*shape, lean)",
     "tests/test_resident_auto_comfy.py::test_each_prompt_decides_again_from_its_free_memory", True),
    ("loaders/comfy/shard/resident_budgets.py", "if freed >= memory_to_free:", "if freed > memory_to_free + (1 << 40):",
     _GIVE_BACK + "test_a_load_that_needs_less_than_the_copies_takes_only_them", True),
    ("parallel/sequence/engine.py", "                stream.keep_resident(0)", "                stream.drop_resident()",
     _GIVE_BACK + "test_a_load_that_needs_less_than_the_copies_takes_only_them", True),
    ("loaders/comfy/shard/resident_budgets.py", "            give_back_first(shard, engine, r.device)", "            pass",
     _GIVE_BACK + "test_the_runs_budgets_make_each_loaded_shard_give_back_first", True),
    # issue 35: the verdict agrees with core's rows
    ("loaders/plan/findings.py", 'core = st.core_fits() if st is not None else ""', 'core = ""',
     "tests/test_plan_strategies_comfy.py::test_a_plan_only_core_can_run_says_so_in_its_verdict", True),
    # issue 35: family data in the registry
    ("parallel/families.py", 'code_variant=("ffn", "linear_input_act", "fused_ffn"), text_encoders=lambda unet: ("umt5-xxl",)),',
     'code_variant=("ffn", "linear_input_act", "fused_ffn")),',
     "tests/test_family_registry.py::test_a_planned_family_fills_every_field_plan_needs", False),
    # issue 33: LTX-2.3's video->audio keys/values priced; the H3 workflow
    ("parallel/families.py", "16 * d * d + 16 * da * da + cross_modal, gathered_kv_width=da),)",
     "16 * d * d + 16 * da * da + cross_modal),)",
     "tests/test_cost_model.py::test_every_family_that_gathers_keys_values_prices_them", False),
    ("parallel/cost/model.py", "    if not b.gathered_kv_width or len(tok) < 2:", "    if True:",
     "tests/test_cost_model.py::test_ltx23_video_to_audio_keys_values_are_priced_in_sequence", False),
    ("parallel/cost/model.py", "            x_wait += kv_s[d]", "            pass",
     "tests/test_cost_model.py::test_ltx23_video_to_audio_keys_values_are_priced_in_sequence", False),
    ("parallel/cost/model.py",
     "    got = {d: samples * 2 * max(0, n - tok[d]) * b.gathered_kv_width * hds[d] / heads * work.activation_bytes",
     "    got = {d: samples * 2 * max(0, n - tok[d]) * b.gathered_kv_width * work.activation_bytes",
     "tests/test_cost_model.py::test_ltx23_video_to_audio_keys_values_are_priced_in_sequence", False),
    ("workflows/minimax_h3_t2v_2gpu.json", '      "min_comfyui": "0.33.0"', '      "min_comfyui": "0.29.0"',
     "tests/test_workflows.py::test_marked_with_the_oldest_comfyui_it_needs", False),
    ("workflows/api/minimax_h3_t2v_2gpu_api.json", '      "type": "minimax",', '      "type": "wan",',
     "tests/test_workflows.py::test_ui_and_api_twins_describe_the_same_graph", False),
    # issue 34: the Ulysses exchange pipelined by head chunks, and priced so
    ("parallel/sequence/split.py", "    ahead = 1  #", "    ahead = 0  #",
     _PIPE + "test_exchanges_overlap_attention_and_race_nothing", False),
    ("parallel/sequence/ulysses.py", 'wait_on("attention_waits_exchange"):\n                ops.wait(cur, done)',
     'wait_on("attention_waits_exchange"):\n                pass', _PIPE + "test_exchanges_overlap_attention_and_race_nothing", False),
    ("parallel/sequence/ulysses.py", 'wait_on("gather_waits_outputs"):\n            ops.wait(cur, done)',
     'wait_on("gather_waits_outputs"):\n            pass', _PIPE + "test_exchanges_overlap_attention_and_race_nothing", False),
    ("parallel/sequence/threads.py", "                ops.wait(x, posts[j][1])", "                pass",
     _PIPE + "test_exchanges_overlap_attention_and_race_nothing", False),
    ("parallel/sequence/threads.py", "            ops.wait(x, ops.record(cur))", "            pass",
     _PIPE + "test_exchanges_overlap_attention_and_race_nothing", False),
    ("parallel/sequence/threads.py", "                ops.wait(cur, event)", "                pass",
     _PIPE + "test_exchanges_overlap_attention_and_race_nothing", False),
    ("parallel/sequence/ulysses.py",
     '    chunks = head_chunks(head_ranges, exchange.pipeline_chunks()) if hasattr(exchange, "pipeline_chunks") else 1',
     "    chunks = 1", _PIPE + "test_chunked_is_the_unchunked_maths", False),
    ("parallel/sequence/threads.py",
     "        return PIPELINE_CHUNKS if all(self.ops.is_async(p) for p in self.places) else 1",
     "        return PIPELINE_CHUNKS", _PIPE + "test_cpu_ranks_keep_the_unpipelined_exchange", False),
    ("parallel/cost/model.py", "            link = max(link, compute) + x_out", "            link = link + x_out",
     _OVERLAP + "test_two_chunks_by_hand", False),
    ("parallel/cost/model.py", "            arrived[c] = link", "            arrived[c] = 0.0",
     _OVERLAP + "test_two_chunks_by_hand", False),
    ("parallel/cost/model.py", "    chunks = head_chunks(head_ranges, PIPELINE_CHUNKS) if pipelined and g > 1 else 1",
     "    chunks = 1", _OVERLAP + "test_the_issue_34_plan_reaches_3_6x_only_with_the_overlap", False),
    ("parallel/cost/model.py", "            exposed = max(0.0, stream + x_s[d] + kv_s[d] - (compute + x_wait))",
     "            exposed = max(0.0, stream - compute)",
     _OVERLAP + "test_the_link_carries_the_stream_and_the_whole_exchange", False),
    ("parallel/cost/mode.py", '    piped = all(d.startswith("cuda") for d in ranks)', "    piped = True",
     _OVERLAP + "test_auto_prices_the_pipeline_only_where_every_rank_is_a_gpu_of_this_machine", False),
    ("parallel/cost/workers.py", "pipelined=False)  # worker processes", "pipelined=True)  # worker processes",
     _OVERLAP + "test_worker_processes_are_priced_with_the_whole_exchange", False),
    # issue 32: rendezvous through a Ray actor, strangers at gloo's ports
    ("parallel/cluster/group.py",
     "    space = secrets.token_hex(16)  # one session's keys apart from the last one's (late writes are refused)",
     "    space = secrets.token_hex(16); _open = dist.TCPStore(\"127.0.0.1\", 0, None, True, "
     "datetime.timedelta(seconds=timeout_s), wait_for_workers=False, use_libuv=True)",
     "tests/test_cluster_ray.py::test_forming_a_group_opens_no_listening_socket_but_gloos_and_its_keys_live_in_the_"
     "rendezvous_actor", CLUSTER),
    ("parallel/cluster/group.py", "            self.board.close.remote(self.space)", "            pass",
     "tests/test_cluster_ray.py::test_a_member_that_never_joins_is_named_within_the_timeout", CLUSTER),
    ("parallel/cluster/host.py", "            if stray:", "            if False:",
     "tests/test_cluster_attack_comfy.py::test_a_stranger_at_every_port_of_the_host_and_member_changes_nothing", CLUSTER),
    ("parallel/cluster/rank_server.py",
     "        raise_fd_limit()  # a stranger's held connections to gloo's ports must not exhaust this rank",
     "        pass",
     "tests/test_cluster_attack_comfy.py::test_a_stranger_at_every_port_of_the_host_and_member_changes_nothing", CLUSTER),
    # issue 35 item 4: one error type
    ("parallel/errors.py", "        super().__init__(text if text.startswith(PREFIX) else PREFIX + text, *args)",
     "        super().__init__(text, *args)",
     "tests/test_errors.py::test_each_kind_is_the_pack_error_and_the_builtin_it_always_was", False),
    ("parallel/errors.py", "        super().__init__(text if text.startswith(PREFIX) else PREFIX + text, *args)",
     "        super().__init__(PREFIX + text, *args)", "tests/test_errors.py::test_a_pickled_copy_keeps_one_prefix",
     False),
    ("loaders/comfy/loading/model_loading.py", 'raise InputError(f"weight_dtype {weight_dtype!r}',
     'raise ValueError(f"[ShardDiT] weight_dtype {weight_dtype!r}',
     "tests/test_errors.py::test_no_error_message_types_the_prefix_by_hand", False),
    # issue 35 item 2: one typed device plan
    ("loaders/comfy/shard/which_devices.py",
     "    chosen = DevicePlan.of_devices(dict.fromkeys(r.device for r in plan.block_ranges))",
     '    chosen = parse_device_plan(",".join(dict.fromkeys(r.device for r in plan.block_ranges)))',
     "tests/test_device_plan_once.py::test_the_devices_string_is_parsed_once_where_it_enters", False),
    ("loaders/cli/selftest/sequence_check.py",
     'sharded = shard_model(model, DevicePlan.of_devices(devices), reserve_vram_gb=0.0, parallel="sequence")',
     'sharded = shard_model(model, ",".join(devices), reserve_vram_gb=0.0, parallel="sequence")',
     "tests/test_device_plan_once.py::test_the_devices_string_is_parsed_once_where_it_enters", False),
    ("parallel/placement/plan_types.py", "        if not isinstance(self.devices, DevicePlan) or self.devices.members:",
     "        if False:", "tests/test_planner.py::test_a_request_takes_the_parsed_plan_not_a_string", False),
    # issue 35 item 4: __all__ lists only what a module defines
    ("loaders/plan/findings.py",
     '__all__ = ["DeviceReport", "SimulationReport", "device_report"]',
     '__all__ = ["DeviceReport", "SimulationReport", "device_report", "format_gib"]',
     "tests/test_packaging.py::test_all_lists_only_what_the_module_defines", False),
    # issue 35 item 4: the engine's collaborators through its constructor
    ("parallel/sequence/engine.py", "        if self._scoped or self._fwd is not None:", "        if False:",
     "tests/test_sequence.py::test_the_runner_arrives_through_the_engine_only", False),
    ("loaders/comfy/shard/compile_guard.py",
     "router.engine.set_split_check(None if prefetch is None else functools.partial(_sequence_reason, prefetch))",
     "router.engine.split_check = None if prefetch is None else functools.partial(_sequence_reason, prefetch)",
     "tests/test_packaging.py::test_no_engine_slot_is_assigned_from_outside", False),
    ("parallel/sequence/engine.py", "if isinstance(e.__cause__, self._interrupt_exceptions):", "if False:",
     "tests/test_sequence.py::"
     "test_should_stop_stops_every_rank_at_its_next_block_and_its_exception_passes_through", False),
    # the memory tracker's coinciding peak: a thread's number, not its reusable ident; the GPU check's toy plan
    ("parallel/simulate.py", "                self._thread.number = next(self._threads)", "                self._thread.number = 0",
     "tests/test_simulate.py::test_coinciding_peak_sums_each_threads_own_peak", False),
    ("benchmarks/gpu_check_seq.py", "ActivationFactors(block=16.6,", "ActivationFactors(block=14.2,",
     "tests/test_gpu_check_dry.py::test_the_memory_sections_plan_holds_the_toys_tracked_peak", False),
    # issue 35 item 1/2: the dry run as stages; the plan CLI reads --devices once
    ("loaders/cli/plan_command.py", "    setup = check_simulation(args.model, given.devices,",
     "    setup = check_simulation(args.model, args.devices,",
     "tests/test_device_plan_once.py::test_the_plan_cli_reads_its_devices_once", False),
    ("loaders/comfy/models/checks.py", "        if strict and dtype not in _DTYPES:", "        if False:",
     "tests/test_simulator_pure.py::test_header_only_meta_state_dict", False),
    ("loaders/plan/setup.py", "        cfg = family.default_cfg", "        cfg = None",
     "tests/test_minimax_h3_comfy.py::test_plan_h3_fp8_on_four_24gib_gpus", True),
    # issue 35 item 4: no plain built-in raise; a caught pack error's reason inside another line
    ("parallel/cost/report.py", 'raise InputError(f"unknown strategies', 'raise ValueError(f"unknown strategies',
     "tests/test_errors.py::test_no_product_code_raises_a_plain_built_in_error", False),
    ("parallel/cost/rows.py", "            return None, reason_of(err)", "            return None, str(err)",
     "tests/test_plan_strategies_comfy.py::test_a_plan_only_core_can_run_says_so_in_its_verdict", True),
    # issue 35 item 4: the prefix once across threads, processes and wrapped messages
    ("parallel/placement/devices.py",
     '            raise InputError(f"device {device!r} does not exist; this machine has {has}; {fix}.{hidden}")',
     '            raise ValueError(f"device {device!r} does not exist; this machine has {has}; {fix}.{hidden}")',
     "tests/test_errors.py::test_no_product_code_raises_a_plain_built_in_error", False),
    ("parallel/placement/inventory.py", 'raise InputError(f"{where}: {reason_of(err)}; accepted: {SPEC_FORM}")',
     'raise InputError(f"{where}: {err}; accepted: {SPEC_FORM}")', "tests/test_inventory.py::test_spec_invalid", False),
    ("parallel/cost/workers.py", 'raise InputError(f"devices {text.strip()!r}: {part!r}: {reason_of(err)}")',
     'raise InputError(f"devices {text.strip()!r}: {part!r}: {err}")',
     "tests/test_dist_plan.py::test_worker_spec_splits_host_devices_from_worker_devices_with_their_free_memory", False),
    ("parallel/cluster/rank_server.py", '"error": f"{type(e).__name__}: {reason_of(e)}"})',
     '"error": f"{type(e).__name__}: {e}"})',
     "tests/test_dist_protocol.py::test_a_rank_reports_a_failed_command_by_its_reason_so_the_host_says_the_prefix_once",
     False),
    ("parallel/sequence/threads.py", 'f"{type(error).__name__}: {reason_of(error)}", rank, self.devices[rank])',
     'f"{type(error).__name__}: {error}", rank, self.devices[rank])',
     "tests/test_sequence.py::test_a_rank_threads_pack_error_reads_with_one_prefix", False),
    ("parallel/distributed/exchange.py", "                    raise WaitTimeout(self._broken)",
     "                    raise TimeoutError(self._broken)",
     "tests/test_errors.py::test_no_product_code_raises_a_plain_built_in_error", False),
    ("parallel/distributed/exchange.py", '                    self._broken = (f"attention exchange {call}: position {pos} waited "',
     '                    self._broken = (f"[ShardDiT] attention exchange {call}: position {pos} waited "',
     "tests/test_dist_exchange_multi.py::test_missing_local_thread_times_out_then_fails_fast", False),
    # issue 35: one fake forward for every dry run (parallel/blocks/dry_forward.simulated_forward)
    ("parallel/simulate.py", "        for mod in module.modules():", "        for mod in []:",
     "tests/test_simulate.py::test_simulated_forward_measures_each_device_and_leaves_the_module_on_meta", False),
    ("parallel/blocks/dry_forward.py", "    prune = _first_blocks_only(lists) if first_only else contextlib.nullcontext()",
     "    prune = contextlib.nullcontext()",
     "tests/test_simulate.py::test_simulated_forward_measures_each_device_and_leaves_the_module_on_meta", False),
    ("parallel/blocks/dry_forward.py", "                        close()", "                        pass",
     "tests/test_simulate.py::test_simulated_forward_runs_a_second_engine_and_always_closes_it", False),
    # issue 35: the plan's rows in stages (sequence_row, cost/rows, the GPU table settled once)
    ("loaders/plan/sequence_row.py", "    for b in ([1] if apart or batch == 1 else [batch, 1]):",
     "    for b in ([1] if apart or batch == 1 else [batch]):",
     "tests/test_plan_strategies_comfy.py::test_wan14b_720p_cfg6_fits_four_12gib_in_lean_sequence", True),
    ("parallel/cost/inputs.py", "        if len(given) not in (1, len(gpus)):", "        if False:",
     "tests/test_sequence_shares_comfy.py::test_plan_prices_and_shows_shares_for_mixed_gpus", True),
    ("parallel/cost/rows.py", "        if gain > 1.005:", "        if False:",
     "tests/test_sequence_shares_comfy.py::test_plan_prices_and_shows_shares_for_mixed_gpus", True),
    ("parallel/placement/inventory.py", "                else d.available_bytes - reserve for d in self.devices}",
     "                else d.available_bytes for d in self.devices}",
     "tests/test_plan_strategies_comfy.py::test_wan14b_720p_cfg6_fits_four_12gib_in_lean_sequence", True),
    # the shard command's undo step holds the graph as it was, not the tracker's lagging state
    ("web/shard_command.js", "  const before = tracker ? structuredClone(rootGraph().serialize()) : null;",
     "  const before = tracker?.activeState;",
     "tests/test_browser_shard.py::test_undo_gives_back_a_change_the_tracker_missed", True),
]


def run_one(n: int, path: str, old: str, new: str, test: str, comfy: bool) -> str:
    """'caught', 'SURVIVED', 'not applied' or 'skipped (...)'."""
    if comfy == CLUSTER and importlib.util.find_spec("ray") is None:
        return "skipped (needs Ray: requirements-cluster.txt)"
    if comfy is True and not os.environ.get("COMFYUI_PATH"):
        return "skipped (needs COMFYUI_PATH)"
    file = REPO / path
    original = file.read_bytes()
    text = original.decode("utf-8")
    if text.count(old) != 1:
        return f"not applied ({text.count(old)} matches of the text)"
    try:
        file.write_text(text.replace(old, new), encoding="utf-8")
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", test]
        if comfy:
            cmd[4:4] = ["-m", "cluster" if comfy == CLUSTER else "comfy"]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    finally:
        file.write_bytes(original)
    tail = proc.stdout.strip().splitlines()[-1:] or ["(no output)"]
    if proc.returncode == 1 and " failed" in tail[0]:
        return f"caught ({tail[0]})"
    return f"SURVIVED (rc {proc.returncode}: {tail[0]})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated mutation numbers (1-based)")
    ap.add_argument("--pure", action="store_true", help="leave out the mutations whose test needs ComfyUI")
    args = ap.parse_args()
    wanted = {int(x) for x in args.only.split(",")} if args.only else None
    bad = 0
    for n, (path, old, new, test, comfy) in enumerate(MUTATIONS, 1):
        if (wanted and n not in wanted) or (args.pure and comfy is True):
            continue
        t0 = time.monotonic()
        verdict = run_one(n, path, old, new, test, comfy)
        bad += verdict.startswith(("SURVIVED", "not applied"))
        print(f"[mutations] {n:2d} {path}: {verdict} [{time.monotonic() - t0:.0f} s] {test.split('::')[-1]}",
              flush=True)
    print(f"[mutations] {'all caught' if not bad else f'{bad} not caught'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
