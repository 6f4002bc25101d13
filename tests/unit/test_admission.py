from app.admission import Admission, LoopLag


def test_requests_beyond_the_bound_are_refused_until_one_leaves() -> None:
    counts: list[int] = []
    admission = Admission(2, max_queue_s=0.02, lag=LoopLag(), on_change=counts.append)
    for _ in range(2):
        assert admission.refusal() is None
        admission.enter()
    assert admission.refusal() == "2 requests in flight"
    admission.leave()
    assert admission.refusal() is None
    assert counts == [1, 2, 1]


def test_a_loop_running_late_refuses_new_requests_and_dates_them_back() -> None:
    lag = LoopLag()
    admission = Admission(10, max_queue_s=0.02, lag=lag)
    for _ in range(10):
        lag.observe(0.05)
    refusal = admission.refusal()
    assert refusal is not None
    assert "wait" in refusal
    assert 0.02 < admission.queued_s <= 0.05


def test_one_late_sample_does_not_refuse_but_a_late_loop_soon_does() -> None:
    lag = LoopLag()
    admission = Admission(10, max_queue_s=0.02, lag=lag)
    lag.observe(0.05)  # a pause, once
    assert admission.refusal() is None
    lag.observe(0.05)
    lag.observe(0.05)
    assert admission.refusal() is not None
    for _ in range(10):
        lag.observe(0.0)
    assert admission.refusal() is None
