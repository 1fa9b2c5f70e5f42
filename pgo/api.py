#!/usr/bin/env python3
"""A stand-in Kubernetes API server for the PGO training run (train.sh): the
pod list of node `pgo-node` (30 pods; other nodes have none) for the agent's
field-selected list, and a watch held open with a bookmark every 2 s.

usage: api.py PORT KUBECONFIG  (writes a kubeconfig for it, then serves)"""
import json, sys, time, threading
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
from urllib.parse import urlparse, parse_qs

def pod(i, node):
    uid = f"00000000-0000-4000-8000-{i:012d}"
    cid = f"{i+1:064x}"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"app-{i}", "namespace": "bench", "uid": uid, "resourceVersion": "10",
                         "labels": {"app": "x"}, "annotations": {"a": "b"}},
            "spec": {"nodeName": node, "containers": [{"name": "app", "image": "busybox", "resources": {}}]},
            "status": {"phase": "Running", "containerStatuses": [{"name": "app", "containerID": f"containerd://{cid}",
                       "image": "busybox", "imageID": "", "ready": True, "restartCount": 0, "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}}

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        u = urlparse(self.path); q = parse_qs(u.query)
        if u.path != "/api/v1/pods":
            self.send_response(404); self.send_header("Content-Length", "0"); self.end_headers(); return
        node = q.get("fieldSelector", [""])[0].split("=")[-1]
        if q.get("watch", ["false"])[0] in ("true", "1"):
            self.send_response(200); self.send_header("Content-Type", "application/json"); self.send_header("Transfer-Encoding", "chunked"); self.end_headers()
            try:
                while True:
                    ev = json.dumps({"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "100"}}}).encode() + b"\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(ev), ev)); self.wfile.flush()
                    time.sleep(2)
            except Exception:
                return
        items = [pod(i, node) for i in range(30)] if node == "pgo-node" else []
        body = json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "100"}, "items": items}).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json"); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)

port = int(sys.argv[1])
server = ThreadingHTTPServer(("127.0.0.1", port), H)
open(sys.argv[2], "w").write(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{port}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
server.serve_forever()
