"""A small SQLAlchemy ORM shop that enqueues a receipt e-mail with every order (the outbox).

The same code runs in the four layouts of docs/embedding.md; ``shop.settings`` picks one from
the environment (``SHOP_LAYOUT``, ``SHOP_DATABASE``, ``SHOP_KERNEL``, ``SHOP_SCHEMA``).
"""
