"""Zone and line events out, as they happen: the notifier that reads the results hub (`notifier`),
webhooks (`webhooks`), MQTT with Home Assistant discovery (`mqtt`) and the filters they share
(`filters`). It never blocks a stream: deliveries queue, bounded, and are counted."""
