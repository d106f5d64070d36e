"""Everything that talks AMQP: the broker link, the queues Chalk declares, a local broker.

- ``_link``: :class:`AmqpLink`, one pika connection on an I/O thread (consume,
  ack, publish with confirms), and the values that cross it
  (:class:`Delivery`, :class:`OutMessage`);
- ``_process``: :class:`ProcessLink`, the same surface with the connection in
  a child process (``_child`` is that process);
- ``_topology``: the queues declared for inputs and outputs (dead-letter and
  retry queues);
- ``_reason``: why a connection failed, in words (refused, timed out, login
  refused), and :func:`connect`, a blocking connection that says so;
- ``_local``: start Debian's RabbitMQ when none answers (``chalk run``, the demo).

Nothing here imports SQLAlchemy, Spark or the pipeline: the broker I/O
process imports this package alone.
"""

from listener_router.broker._link import (
    EVENT_TOPIC_HEADER,
    AmqpLink,
    Deliveries,
    Delivery,
    Link,
    OutMessage,
    connection_parameters,
    properties_of,
    publish_confirmed,
)
from listener_router.broker._local import broker_reachable, ensure_local_broker
from listener_router.broker._process import ProcessLink
from listener_router.broker._reason import broker_reason, connect
from listener_router.broker._topology import (
    declare_all,
    declare_input,
    declare_new_outputs,
    declare_outputs,
    dlq_name,
    retry_name,
)

__all__ = [
    "EVENT_TOPIC_HEADER",
    "AmqpLink",
    "Deliveries",
    "Delivery",
    "Link",
    "OutMessage",
    "ProcessLink",
    "broker_reachable",
    "broker_reason",
    "connect",
    "connection_parameters",
    "declare_all",
    "declare_input",
    "declare_new_outputs",
    "declare_outputs",
    "dlq_name",
    "ensure_local_broker",
    "properties_of",
    "publish_confirmed",
    "retry_name",
]
