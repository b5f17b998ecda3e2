"""The models a server holds: the manager (`manager`: load, unload, the memory budget, leases
from `leases`), opening a model folder into sessions (`opening`), the manager's options
(`options`), its decisions as pure functions (`policy`) and a loaded model (`loaded`)."""
