"""PyBench's twelve fine-grained ``category1`` labels mapped to the paper's five categories.

Two labels are split by sub-category (``category2``): text mining's plotting tasks count as chart analysis,
and the drawing label's word clouds count as text analysis while its QR codes and shapes count as image
editing. The result is 62 / 23 / 48 / 6 / 4 over the 143 tasks.
"""

_BY_LABEL = {
    "简单数据分析处理": "Chart",
    "简单机器学习": "Chart",
    "总结分析": "Chart",
    "文档处理": "Text",
    "OCR": "Text",
    "网页搜索和爬虫": "Text",
    "图片处理": "Image&Audio",
    "音频处理": "Image&Audio",
    "数学求解": "Math",
    "简单程序开发": "Software",
}


def _label(category1: str) -> str:
    """Return the label without its parenthesised library list and line breaks: '图片处理（PIL...）' -> '图片处理'."""
    flat = category1.replace("\n", "").strip()
    return flat.split("（", 1)[0].split("(", 1)[0].strip()


def paper_category(category1: str, category2: str = "") -> str:
    """Return the paper's category for a task's labels.

    Raises:
        ValueError: an unknown label; the message lists the known ones.
    """
    label = _label(category1)
    if label == "文本挖掘":
        return "Chart" if category2.strip() == "画图" else "Text"
    if label == "作图":
        return "Text" if category2.strip() == "词云" else "Image&Audio"
    try:
        return _BY_LABEL[label]
    except KeyError:
        known = ", ".join([*_BY_LABEL, "文本挖掘", "作图"])
        raise ValueError(f"unknown PyBench category {category1!r}; known labels: {known}") from None
