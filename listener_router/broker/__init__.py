"""Everything that talks AMQP: the broker link, the queues Chalk declares, a local broker.

- ``_link``: :class:`AmqpLink`, one pika connection on an I/O thread (consume,
  ack, publish with confirms);
- ``_values``: what crosses a link (:class:`Delivery`, :class:`OutMessage`),
  the :class:`Link` surface, :func:`publish_confirmed`;
- ``_process``: :class:`ProcessLink`, the same surface with the connection in
  a child process (``_child`` is that process);
- ``_queues``: the queues declared for inputs and outputs (dead-letter and
  retry queues);
- ``_connection``: the nodes a broker URL names (one, or several of a
  cluster), the parameters of every connection, why one failed in words
  (refused, timed out, login refused), and :func:`connect`, a blocking
  connection to the first node that answers, that says so;
- ``_local``: start Debian's RabbitMQ when none answers (``chalk run``, the demo);
- ``_bytes``: the bodies a link holds against ``max_inflight_bytes``, and the prefetch
  that fits; ``_memory``: large bodies mapped, so freeing them shrinks the process.

Nothing here imports SQLAlchemy, Spark or the pipeline: the broker I/O
process imports this package alone (and the settings its declarations read).
"""

from listener_router.broker._connection import (
    broker_reason,
    broker_urls,
    connect,
    connection_parameters,
    node_parameters,
    where,
)
from listener_router.broker._link import AmqpLink
from listener_router.broker._local import broker_reachable, ensure_local_broker
from listener_router.broker._memory import map_large_bodies
from listener_router.broker._process import ProcessLink
from listener_router.broker._queues import (
    declare_all,
    declare_input,
    declare_new_outputs,
    declare_outputs,
    dlq_name,
    plugin_exchanges,
    retry_name,
)
from listener_router.broker._values import (
    EVENT_TOPIC_HEADER,
    Deliveries,
    DeliveriesByQueue,
    Delivery,
    Link,
    OutMessage,
    properties_of,
    publish_confirmed,
)

__all__ = [
    "EVENT_TOPIC_HEADER",
    "AmqpLink",
    "Deliveries",
    "DeliveriesByQueue",
    "Delivery",
    "Link",
    "OutMessage",
    "ProcessLink",
    "broker_reachable",
    "broker_reason",
    "broker_urls",
    "connect",
    "connection_parameters",
    "declare_all",
    "declare_input",
    "declare_new_outputs",
    "declare_outputs",
    "dlq_name",
    "ensure_local_broker",
    "map_large_bodies",
    "node_parameters",
    "plugin_exchanges",
    "properties_of",
    "publish_confirmed",
    "retry_name",
    "where",
]
