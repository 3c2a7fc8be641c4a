"""One headless Chromium for one environment instance, driven by its own chromedriver under an engine guard.

    browser = Browser()                 # chromedriver + Chromium started (browser.start_s seconds)
    browser.driver.get(url)             # a selenium WebDriver session
    browser.close()                     # both gone, with every process Chromium started

- Never left behind: chromedriver runs under omrl.envs.engine.GuardedProcess, and Chromium with all its
  helpers (zygotes, renderers, GPU and utility processes) is chromedriver's child in the same process
  group, which the guard kills when the browser is closed or the omrl process dies, SIGKILL included.
  Chromium's crash handlers (chrome_crashpad_handler) sit in sessions of their own; they exit when the
  browser they watch is gone (tested with the rest).
- No network beyond the task pages: the pages are file:// URLs; every http(s) and WebSocket request goes
  to a proxy address where nothing listens (loopback included), host names resolve to nothing, WebRTC
  may not use UDP (a profile preference, CHROMIUM_PREFS), and Chromium's background services (updates, sync,
  metrics, safe browsing) are off.
- Selenium Manager (which looks up and downloads drivers over the internet) never runs: selenium talks
  to the chromedriver started here as a remote end (webdriver.Remote), with the driver's path given
  explicitly; its statistics are switched off (SE_AVOID_STATS) should anything in the process call it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Any

from omrl.envs.engine import GuardedProcess

WINDOW = (500, 320)  # MiniWoB's own window size (its task area is the top-left 160x210 px)
DEAD_PROXY = "127.0.0.1:9"  # the discard port: nothing answers there
DRIVER_TRIES = 3
CHROMIUM_FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
    "--no-default-browser-check", "--disable-extensions", "--disable-sync", "--disable-background-networking",
    "--disable-component-update", "--disable-default-apps", "--disable-domain-reliability", "--no-pings",
    "--disable-client-side-phishing-detection", "--safebrowsing-disable-auto-update", "--metrics-recording-only",
    "--disable-breakpad", "--disable-features=OptimizationGuideModelDownloading,OptimizationHints,Translate,"
    "MediaRouter,AutofillServerCommunication,CertificateTransparencyComponentUpdater",
    f"--proxy-server={DEAD_PROXY}", "--proxy-bypass-list=<-loopback>", "--host-resolver-rules=MAP * ~NOTFOUND",
    "--mute-audio", "--hide-scrollbars",
)
# WebRTC's UDP is switched off by the profile's preference, not a flag: with only
# --force-webrtc-ip-handling-policy=disable_non_proxied_udp, Chromium 156 still gathered host candidates and
# sent a page's STUN request to a UDP port on 127.0.0.1, past the dead proxy. With the preference, WebRTC may
# only go through the proxy (TCP, to where nothing listens) and gathers no candidate at all.
CHROMIUM_PREFS = {"webrtc.ip_handling_policy": "disable_non_proxied_udp"}


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def chromedriver_path() -> str | None:
    return shutil.which("chromedriver")


class BrowserError(RuntimeError):
    """The browser or its driver could not be started."""


class Browser:
    """A headless Chromium with its chromedriver; `driver` is the selenium session."""

    def __init__(self, *, window: tuple[int, int] = WINDOW, start_timeout: float = 90.0,
                 page_timeout: float = 60.0) -> None:
        from selenium import webdriver
        from selenium.webdriver.common.proxy import Proxy, ProxyType
        from selenium.webdriver.remote.client_config import ClientConfig

        chromium, chromedriver = chromium_path(), chromedriver_path()
        if not chromium or not chromedriver:
            raise BrowserError("needs chromium and chromedriver on PATH (apt-get install chromium chromium-driver)")
        os.environ.setdefault("SE_AVOID_STATS", "true")
        started = time.monotonic()
        self.profile = tempfile.mkdtemp(prefix="omrl-chromium-")
        self.driver: Any = None
        self.process: GuardedProcess | None = None
        try:
            self.process, port = start_chromedriver(chromedriver, start_timeout)
            options = webdriver.ChromeOptions()
            options.binary_location = chromium
            options.add_experimental_option("prefs", CHROMIUM_PREFS)
            for flag in (*CHROMIUM_FLAGS, f"--window-size={window[0]},{window[1]}", f"--user-data-dir={self.profile}"):
                options.add_argument(flag)
            url = f"http://127.0.0.1:{port}"
            config = ClientConfig(remote_server_addr=url, timeout=int(start_timeout),
                                  proxy=Proxy({"proxyType": ProxyType.DIRECT}))
            self.driver = webdriver.Remote(command_executor=url, options=options, client_config=config)
            self.driver.set_page_load_timeout(page_timeout)
            self.driver.set_script_timeout(page_timeout)
            # --window-size is the outer size; make the page's own viewport the size MiniWoB expects.
            inner = self.driver.execute_script("return [window.innerWidth, window.innerHeight];")
            outer = self.driver.get_window_size()
            self.driver.set_window_size(outer["width"] + window[0] - inner[0], outer["height"] + window[1] - inner[1])
        except BaseException as exc:
            self.close()
            if isinstance(exc, Exception) and not isinstance(exc, BrowserError):
                raise BrowserError(f"starting Chromium failed: {type(exc).__name__}: {str(exc).strip()[:300]}") from exc
            raise
        self.start_s = time.monotonic() - started

    def engine_pids(self) -> list[int]:
        """chromedriver's process group: chromedriver, then Chromium and its helpers."""
        return self.process.engine_pids() if self.process is not None else []

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def close(self) -> None:
        """Kill chromedriver's group (Chromium and its helpers) and remove the profile; idempotent.

        No WebDriver quit first: a hung browser would hold it up to the client timeout, and the profile
        is thrown away anyway."""
        self.driver = None
        if self.process is not None:
            self.process.close()
        shutil.rmtree(self.profile, ignore_errors=True)


def start_chromedriver(chromedriver: str, timeout: float) -> tuple[GuardedProcess, int]:
    """chromedriver under an engine guard, listening on 127.0.0.1: (its process, its port).

    The port is one the kernel just gave out (chromedriver's own --port=0 races when several start at once:
    it binds IPv4 and IPv6 separately); a driver that still fails to bind, exits or stays silent is killed
    and started again on another port, DRIVER_TRIES times in all, within `timeout` seconds."""
    problems = []
    deadline = time.monotonic() + timeout
    for _ in range(DRIVER_TRIES):
        port = _free_port()
        # Its stdout is read (and closed with it) by the guarded process: left unread, the pipe would fill.
        process = GuardedProcess([chromedriver, f"--port={port}"], stdout=subprocess.PIPE, name="chromedriver")
        while time.monotonic() < deadline and not _ready(process) and process.alive():
            if "bind() failed" in process.stderr_tail():
                break
            time.sleep(0.1)
        if _ready(process) and process.alive() and "bind() failed" not in process.stderr_tail():
            return process, port
        problems.append(f"port {port}: {process.exit_status()}, {process.stderr_tail(2) or 'no output'}")
        process.close()
        if time.monotonic() >= deadline:
            break
    raise BrowserError(f"chromedriver did not start: {'; '.join(problems)}")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _ready(process: GuardedProcess) -> bool:
    """Whether chromedriver said it listens (its first lines: nothing else is printed before)."""
    return "started successfully on port" in process.stdout_tail(20)
