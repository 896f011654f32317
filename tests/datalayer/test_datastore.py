from epp.datalayer.datastore import Datastore
from epp.framework import DataKey, DataMap, Endpoint
from epp.requestcontrol.types import locate_candidates


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def endpoint_added(self, ep: Endpoint) -> None:
        self.events.append(("add", ep.name))

    def endpoint_updated(self, ep: Endpoint) -> None:
        self.events.append(("update", ep.name))

    def endpoint_removed(self, ep: Endpoint) -> None:
        self.events.append(("remove", ep.name))


def test_upsert_remove_notify() -> None:
    ds = Datastore()
    rec = Recorder()
    ds.subscribe(rec)
    assert ds.upsert(Endpoint("a", "10.0.0.1", 8000))
    assert not ds.upsert(Endpoint("a", "10.0.0.1", 8000, labels={"x": "y"}))
    assert ds.get("a") is not None and ds.get("a").labels == {"x": "y"}  # type: ignore[union-attr]
    assert ds.upsert(Endpoint("a", "10.0.0.2", 8000))  # address change = remove + add
    ds.replace_all([Endpoint("b", "10.0.0.3", 8000)])
    assert [e.name for e in ds.endpoints()] == ["b"]
    assert rec.events == [
        ("add", "a"),
        ("update", "a"),  # the new labels
        ("remove", "a"),
        ("add", "a"),
        ("remove", "a"),
        ("add", "b"),
    ]
    assert ds.get_by_hostport("10.0.0.3:8000") is ds.get("b")


def test_label_or_attribute_change_in_place_notifies_an_update() -> None:
    key = DataKey[str]("k")
    ds = Datastore()
    rec = Recorder()
    ds.subscribe(rec)
    ep = Endpoint("a", "10.0.0.1", 8000, labels={"x": "1"})
    ds.upsert(ep)
    assert not ds.upsert(Endpoint("a", "10.0.0.1", 8000, labels={"x": "1"}))  # nothing changed: no notification
    assert not ds.upsert(Endpoint("a", "10.0.0.1", 8000, labels={"x": "2"}))
    assert ds.get("a") is ep and ep.labels == {"x": "2"}  # the same object, updated in place
    ds.upsert(Endpoint("a", "10.0.0.1", 8000, labels={"x": "2"}, attributes=DataMap({key: "v"})))
    ds.upsert(Endpoint("a", "10.0.0.1", 8000, labels={"x": "2"}, attributes=DataMap({key: "v"})))
    assert ep.attributes.get(key) == "v"
    assert rec.events == [("add", "a"), ("update", "a"), ("update", "a")]


def test_ipv6_hostport_and_subset() -> None:
    eps = [Endpoint("a", "10.0.0.1", 8000), Endpoint("b", "10.0.0.1", 8001), Endpoint("c", "fd00::1", 8000)]
    assert eps[2].hostport == "[fd00::1]:8000"
    assert locate_candidates(eps, None) == eps
    assert locate_candidates(eps, []) == []
    assert [e.name for e in locate_candidates(eps, ["10.0.0.1:8001"])] == ["b"]
    assert [e.name for e in locate_candidates(eps, ["10.0.0.1"])] == ["a", "b"]
    assert [e.name for e in locate_candidates(eps, ["[fd00::1]:8000"])] == ["c"]


def test_synced_watchers_hear_each_change_once() -> None:
    ds = Datastore()
    heard: list[bool] = []
    stop = ds.watch_synced(lambda: heard.append(ds.synced))
    ds.synced = True
    ds.synced = True  # no change: not told again
    ds.synced = False
    stop()
    ds.synced = True
    assert heard == [True, False]
    stop()  # idempotent
