"""Generic webhook: Alertmanager's JSON as received, or a user template, signed.

Headers: ``X-Gpuload-Timestamp`` (unix seconds when sent), ``X-Gpuload-Dedup-Key``
(the same for re-deliveries of one notification, so receivers can drop
duplicates) and, with a secret, ``X-Gpuload-Signature: sha256=<hex>``, the
HMAC-SHA256 of the body keyed with the secret (GitHub's scheme).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from exporter.relay.payload import Notification
from exporter.relay.targets.base import OutboundRequest, Target, register


def signature(secret: str, body: bytes) -> str:
    """The value of X-Gpuload-Signature."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


@register
class Webhook(Target):
    """Any HTTP endpoint taking Alertmanager's webhook JSON."""

    kind = "webhook"
    secrets = ("url", "secret")
    digests = False

    def request(self, notifications: Sequence[Notification], now: float) -> OutboundRequest:
        """The notification's JSON (or the template's output), signed when a secret is set."""
        notification = notifications[0]
        custom = self.user_text(notification)
        body = (custom if custom is not None else notification.to_json()).encode()
        headers = {
            "Content-Type": self.config.content_type,
            "X-Gpuload-Timestamp": str(int(now)),
            "X-Gpuload-Dedup-Key": notification.dedup_key(),
        }
        if self.config.secret is not None:
            headers["X-Gpuload-Signature"] = signature(self.config.secret.value, body)
        return OutboundRequest(self.url, body, headers)
