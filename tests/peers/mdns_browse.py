"""An independent mDNS/DNS-SD browser for tests/discovery.rs (python-zeroconf).

Browses SERVICE_TYPE on the interface with address ADDR and prints one JSON line per event:
  {"event": "ready"}                       once browsing has started
  {"event": "resolved", "name", "server", "port", "addresses", "txt", "reachable"}
  {"event": "removed", "name"}             on a goodbye (or expiry)
"reachable" says whether a TCP connection to the first address and the port succeeded, i.e.
whether a phone that found the gateway this way could reach it. Exits after LIFETIME seconds
or when stdin closes, whichever comes first.

usage: mdns_browse.py SERVICE_TYPE ADDR LIFETIME
"""

import json
import socket
import sys
import threading

from zeroconf import IPVersion, ServiceBrowser, ServiceStateChange, Zeroconf


def say(**fields):
    print(json.dumps(fields), flush=True)


def main():
    service_type, addr, lifetime = sys.argv[1], sys.argv[2], float(sys.argv[3])
    zc = Zeroconf(interfaces=[addr], ip_version=IPVersion.V4Only)

    def on_change(zeroconf, service_type, name, state_change):
        if state_change is ServiceStateChange.Removed:
            say(event="removed", name=name)
            return
        if state_change is not ServiceStateChange.Added:
            return
        info = zeroconf.get_service_info(service_type, name, timeout=5000)
        if info is None:
            say(event="unresolved", name=name)
            return
        addresses = info.parsed_addresses()
        reachable = False
        if addresses:
            try:
                socket.create_connection((addresses[0], info.port), timeout=3).close()
                reachable = True
            except OSError:
                pass
        txt = {
            k.decode(): (v.decode() if v is not None else None)
            for k, v in info.properties.items()
        }
        say(
            event="resolved",
            name=name,
            server=info.server,
            port=info.port,
            addresses=addresses,
            txt=txt,
            reachable=reachable,
        )

    ServiceBrowser(zc, service_type, handlers=[on_change])
    say(event="ready")
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    done.wait(lifetime)
    zc.close()


if __name__ == "__main__":
    main()
