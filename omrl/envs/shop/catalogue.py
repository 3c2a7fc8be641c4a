"""The shop's products: a deterministic catalogue of WebShop-like product types, attributes, options and prices."""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass, field

COLORS = ["black", "white", "red", "blue", "green", "grey", "navy", "pink", "beige", "brown"]
# product type -> (category path, attribute pool, option names -> value pool, price range)
PRODUCT_TYPES: dict[str, tuple[str, list[str], dict[str, list[str]], tuple[float, float]]] = {
    "shirt": ("Clothing › Men › Shirts", ["cotton", "long sleeve", "short sleeve", "slim fit", "machine wash",
                                         "button down"], {"color": COLORS, "size": ["s", "m", "l", "xl"]}, (12, 60)),
    "dress": ("Clothing › Women › Dresses", ["cotton", "sleeveless", "floral", "machine wash", "knee length"],
              {"color": COLORS, "size": ["xs", "s", "m", "l"]}, (18, 90)),
    "jeans": ("Clothing › Men › Jeans", ["slim fit", "stretch", "relaxed fit", "machine wash", "high waist"],
              {"color": ["blue", "black", "grey"], "size": ["30", "32", "34", "36"]}, (20, 80)),
    "sneakers": ("Shoes › Sneakers", ["running", "lightweight", "non slip", "breathable", "memory foam"],
                 {"color": COLORS, "size": ["7", "8", "9", "10", "11"]}, (25, 120)),
    "backpack": ("Bags › Backpacks", ["waterproof", "laptop sleeve", "lightweight", "usb charging", "anti theft"],
                 {"color": COLORS}, (15, 70)),
    "headphones": ("Electronics › Audio › Headphones", ["wireless", "noise cancelling", "over ear", "bluetooth",
                                                        "foldable"], {"color": ["black", "white", "blue"]}, (20, 200)),
    "mug": ("Home › Kitchen › Mugs", ["ceramic", "dishwasher safe", "microwave safe", "insulated"],
            {"color": COLORS, "size": ["12 oz", "16 oz", "20 oz"]}, (6, 30)),
    "lamp": ("Home › Lighting › Lamps", ["led", "dimmable", "usb charging", "touch control", "adjustable"],
             {"color": ["black", "white", "gold", "silver"]}, (15, 90)),
    "shampoo": ("Beauty › Hair Care › Shampoo", ["sulfate free", "paraben free", "natural", "for dry hair"],
                {"size": ["8 oz", "16 oz", "32 oz"]}, (5, 40)),
    "phone case": ("Electronics › Accessories › Cases", ["shockproof", "slim", "clear", "magnetic"],
                   {"color": COLORS, "model": ["iphone 14", "iphone 15", "galaxy s23", "pixel 8"]}, (8, 45)),
}
BRANDS = ["Acme", "Northwind", "Zenith", "Bluepeak", "Evergreen", "Solara", "Kestrel", "Harbor", "Lumen", "Orchard"]


@dataclass
class Product:
    asin: str
    title: str
    query: str                      # the product type
    product_category: str
    attributes: list[str]
    options: dict[str, list[str]]
    price: float
    words: set[str] = field(default_factory=set)


@functools.lru_cache(maxsize=16)
def catalogue(seed: int = 0, size: int = 200) -> tuple[Product, ...]:
    """A deterministic product catalogue: the same (seed, size) always gives the same products."""
    rng = random.Random(f"shop-catalogue-{seed}")
    products = []
    types = sorted(PRODUCT_TYPES)
    for i in range(size):
        kind = types[i % len(types)]
        category, pool, option_pool, (low, high) = PRODUCT_TYPES[kind]
        attributes = rng.sample(pool, rng.randint(2, 3))
        while {"long sleeve", "short sleeve"} <= set(attributes):  # no contradictory products
            attributes = rng.sample(pool, rng.randint(2, 3))
        options = {name: sorted(rng.sample(values, min(len(values), rng.randint(2, 4))))
                   for name, values in option_pool.items()}
        title = f"{rng.choice(BRANDS)} {' '.join(a.title() for a in attributes[:2])} {kind.title()}"
        asin = "B0" + "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ0123456789") for _ in range(8))
        product = Product(asin=asin, title=title, query=kind, product_category=category, attributes=attributes,
                          options=options, price=round(rng.uniform(low, high), 2))
        product.words = set(words_of(" ".join([title, kind, category, *attributes])))
        products.append(product)
    return tuple(products)


def words_of(text: str) -> list[str]:
    """The lower-case words of a text, as search and the type reward match them."""
    return re.findall(r"[a-z0-9]+", text.lower())
