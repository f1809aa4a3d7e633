"""A module that starts a thread when imported, as some libraries do: a fork server must refuse to fork with it
(tests preload it through the launcher's ``preload_modules``)."""

import threading
import time

threading.Thread(target=time.sleep, args=(3600,), name="started-at-import", daemon=True).start()
