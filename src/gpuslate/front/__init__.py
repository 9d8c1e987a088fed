"""The front: a real reverse proxy (Caddy) in front of a unit, which gpuslate starts and steers.

Clients use the front's port; the front holds their requests while the unit behind it changes
(``swap``, ``restart``) and lets them through, in their order, once the next unit is proven
ready. This package knows Caddy (finding the binary, the configurations, the admin API over a
Unix socket, the counters that say what clients saw); it imports nothing of :mod:`gpuslate.units`,
which runs the front's processes as it runs a unit's (:mod:`gpuslate.units.front`).
"""
