"""The official Kubernetes Python client against the drivelab kube fake.

Run by fakes/tests/kube_clients.rs, which starts the fake over TLS and writes
one kubeconfig (server, CA, token) per identity: cluster-admin, a COSI
driver's service account, a service account bound to nothing, a token the
cluster never issued, and no credentials.
"""

import os
import uuid

import pytest
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

DRIVER_NS = os.environ.get("DRIVER_NAMESPACE", "")

if not os.environ.get("KUBECONFIG_ADMIN"):
    pytest.exit("KUBECONFIG_ADMIN is not set: run this through `cargo test -p drivelab-fakes --test kube_clients`", 2)


def api(who):
    return config.new_client_from_config(config_file=os.environ[f"KUBECONFIG_{who}"])


def core(who):
    return client.CoreV1Api(api(who))


def name(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def refused(fn, status):
    with pytest.raises(ApiException) as e:
        fn()
    assert e.value.status == status, e.value.body
    return e.value


def test_no_credentials_and_a_foreign_token_are_401():
    e = refused(lambda: core("ANONYMOUS").list_namespaced_secret("drivelab-system"), 401)
    assert "Unauthorized" in e.body
    refused(lambda: core("FORGED").read_namespaced_secret("s3-admin", "drivelab-system"), 401)


def test_the_driver_reads_the_admin_secret_and_keeps_state_in_its_namespace():
    drv = core("DRIVER")
    s = drv.read_namespaced_secret("s3-admin", "drivelab-system")
    assert "secretKey" in s.data
    cm = name("ckpt")
    body = client.V1ConfigMap(metadata=client.V1ObjectMeta(name=cm), data={"k": "v"})
    drv.create_namespaced_config_map(DRIVER_NS, body)
    got = drv.read_namespaced_config_map(cm, DRIVER_NS)
    assert got.data == {"k": "v"}
    drv.delete_namespaced_config_map(cm, DRIVER_NS)


def test_what_the_role_does_not_grant_is_403_worded_as_rbac():
    drv = core("DRIVER")
    body = client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name("x")))
    e = refused(lambda: drv.create_namespaced_config_map("kube-system", body), 403)
    assert 'cannot create resource \\"configmaps\\"' in e.body, e.body
    e = refused(lambda: core("NOBODY").read_namespaced_secret("s3-admin", "drivelab-system"), 403)
    assert "system:serviceaccount:default:nobody" in e.body
    custom = client.CustomObjectsApi(api("DRIVER"))
    refused(lambda: custom.list_cluster_custom_object("objectstorage.k8s.io", "v1alpha1", "bucketclasses"), 403)
    # Buckets are the driver's to manage.
    custom.list_cluster_custom_object("objectstorage.k8s.io", "v1alpha1", "buckets")


def test_admin_watches_what_the_driver_writes():
    admin = core("ADMIN")
    cm = name("watched")
    start = admin.list_namespaced_config_map(DRIVER_NS).metadata.resource_version
    core("DRIVER").create_namespaced_config_map(
        DRIVER_NS, client.V1ConfigMap(metadata=client.V1ObjectMeta(name=cm))
    )
    seen = []
    w = watch.Watch()
    for ev in w.stream(
        admin.list_namespaced_config_map, DRIVER_NS, resource_version=start, timeout_seconds=5
    ):
        seen.append((ev["type"], ev["object"].metadata.name))
        if ev["object"].metadata.name == cm:
            w.stop()
    assert ("ADDED", cm) in seen, seen


def test_unknown_fields_under_strict_and_default_field_validation():
    admin = core("ADMIN")
    cm = name("strict")
    admin.create_namespaced_config_map(
        DRIVER_NS, client.V1ConfigMap(metadata=client.V1ObjectMeta(name=cm), data={"a": "b"})
    )
    merge = dict(_content_type="application/merge-patch+json")
    patch = {"data": {"a": "c"}, "colour": "red"}
    e = refused(
        lambda: admin.patch_namespaced_config_map(cm, DRIVER_NS, patch, field_validation="Strict", **merge),
        400,
    )
    assert 'strict decoding error: unknown field \\"colour\\"' in e.body, e.body
    # The default (Warn) drops the field and stores the rest.
    patched = admin.patch_namespaced_config_map(cm, DRIVER_NS, patch, **merge)
    assert patched.data == {"a": "c"}
    raw = admin.read_namespaced_config_map(cm, DRIVER_NS, _preload_content=False).data
    assert b"colour" not in raw, raw


def test_server_side_apply_conflicts_and_force():
    admin = core("ADMIN")
    cm = name("applied")
    admin.create_namespaced_config_map(
        DRIVER_NS,
        client.V1ConfigMap(metadata=client.V1ObjectMeta(name=cm), data={"a": "1"}),
        field_manager="py-create",
    )
    config_ = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": cm}, "data": {"a": "2"}}
    apply = dict(field_manager="py-apply", _content_type="application/apply-patch+yaml")
    e = refused(lambda: admin.patch_namespaced_config_map(cm, DRIVER_NS, config_, **apply), 409)
    assert 'conflict with \\"py-create\\" using v1: .data.a' in e.body, e.body
    done = admin.patch_namespaced_config_map(cm, DRIVER_NS, config_, force=True, **apply)
    assert done.data == {"a": "2"}
    owned = {(m.manager, m.operation): m.fields_v1 for m in done.metadata.managed_fields}
    assert owned[("py-apply", "Apply")] == {"f:data": {"f:a": {}}}, owned
    # The creator keeps the map it made, not the field taken from it.
    assert owned[("py-create", "Update")] == {"f:data": {}}, owned
