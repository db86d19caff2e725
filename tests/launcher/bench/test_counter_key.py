"""The counter keys of `radiance bench` and the status reader (launcher.engine_report): a labelled family's
members stay apart (MTP forwards run vs skipped), vLLM's labels and the rank are summed over."""
from launcher.engine_report import counter_key


def test_labels_but_the_rank_are_kept_in_the_key():
    run = counter_key("radiance:draft_mtp_forwards_total", {"state": "run", "rank": "0"})
    skipped = counter_key("radiance:draft_mtp_forwards_total", {"state": "skipped", "rank": "1"})
    assert run == "radiance:draft_mtp_forwards_total{state=run}" and run != skipped
    assert counter_key("radiance:draft_mtp_forwards_total", {"state": "run", "rank": "1"}) == run
    assert counter_key("radiance:draft_steps_total", {"model_name": "tiny", "engine": "0"}) == \
        "radiance:draft_steps_total"
