"""The rule oracle scores the same paragraph alike in any script (issue 20, item 2).

The paragraphs are one short text about a library, written in English and translated by hand for this
test; before the fix the Hindi one scored 0/2/0/0 where the English one scored 3/4/4/2.
"""

from __future__ import annotations

import pytest

from moe_dag.quality.oracle import GENERAL
from moe_dag.quality.oracle.rules import score_general

LIBRARY = {
    "en": (
        "The city library opened a new reading room la"
        "st spring. It holds more than twenty thousand"
        " books on history, science and art, and it is"
        " free for every resident. Visitors can borrow"
        " up to ten books for three weeks, and the sta"
        "ff will order any title that the library does"
        " not have. On weekends the library runs readi"
        "ng classes for children and lessons on using "
        "computers for older adults. Since the room op"
        "ened, the number of visitors has nearly doubl"
        "ed, and many students now come to study there"
        " every evening."
    ),
    "hi": (
        "शहर के पुस्तकालय ने पिछले वसंत में एक नया वाच"
        "नालय खोला। इसमें इतिहास, विज्ञान और कला पर बी"
        "स हज़ार से अधिक पुस्तकें हैं, और यह हर निवासी"
        " के लिए निःशुल्क है। पाठक तीन सप्ताह के लिए द"
        "स पुस्तकें तक उधार ले सकते हैं, और कर्मचारी क"
        "ोई भी ऐसी पुस्तक मँगवा देंगे जो पुस्तकालय में"
        " नहीं है। सप्ताहांत में पुस्तकालय बच्चों के ल"
        "िए पढ़ने की कक्षाएँ और बुज़ुर्गों के लिए कंप्"
        "यूटर चलाने के पाठ आयोजित करता है। वाचनालय खुल"
        "ने के बाद से आगंतुकों की संख्या लगभग दोगुनी ह"
        "ो गई है, और अब कई छात्र हर शाम वहाँ पढ़ने आते"
        " हैं।"
    ),
    "ar": (
        "افتتحت مكتبة المدينة قاعة مطالعة جديدة في الر"
        "بيع الماضي. تضم القاعة أكثر من عشرين ألف كتاب"
        " في التاريخ والعلوم والفنون، وهي مجانية لكل س"
        "كان المدينة. يستطيع الزوار استعارة ما يصل إلى"
        " عشرة كتب لمدة ثلاثة أسابيع، ويطلب الموظفون أ"
        "ي كتاب غير موجود في المكتبة. وفي عطلة نهاية ا"
        "لأسبوع تنظم المكتبة دروسا في القراءة للأطفال "
        "ودروسا في استخدام الحاسوب لكبار السن. ومنذ اف"
        "تتاح القاعة تضاعف عدد الزوار تقريبا، وأصبح كث"
        "ير من الطلاب يأتون للدراسة فيها كل مساء."
    ),
    "zh": (
        "市图书馆去年春天开设了一间新的阅览室。阅览室收藏了两万多本关于历史、科学和艺术的图书，所有"
        "居民都可以免费使用。读者每次最多可以借十本书，借期三周；如果图书馆没有某本书，工作人员会帮"
        "忙订购。每到周末，图书馆会为孩子们举办阅读课，也为老年人开设电脑使用课程。阅览室开放以来，"
        "来访人数几乎翻了一番，现在很多学生每天晚上都来这里学习。"
    ),
    "ru": (
        "Городская библиотека прошлой весной открыла н"
        "овый читальный зал. В нём хранится более двад"
        "цати тысяч книг по истории, науке и искусству"
        ", и он бесплатен для всех жителей. Посетители"
        " могут брать до десяти книг на три недели, а "
        "сотрудники закажут любую книгу, которой нет в"
        " библиотеке. По выходным библиотека проводит "
        "занятия по чтению для детей и уроки работы на"
        " компьютере для пожилых людей. С открытия зал"
        "а число посетителей выросло почти вдвое, и те"
        "перь многие студенты приходят сюда заниматься"
        " каждый вечер."
    ),
    "ja": (
        "市立図書館は昨年の春、新しい閲覧室を開きました。閲覧室には歴史、科学、芸術に関する二万冊以"
        "上の本があり、すべての住民が無料で利用できます。利用者は一度に十冊まで、三週間借りることが"
        "でき、図書館にない本は職員が取り寄せてくれます。週末には、子ども向けの読書教室や、高齢者向"
        "けのパソコン教室が開かれています。閲覧室が開いてから来館者の数はほぼ倍になり、今では多くの"
        "学生が毎晩ここで勉強しています。"
    ),
    "th": (
        "ห้องสมุดประจำเมืองเปิดห้องอ่านหนังสือแห่งใหม่"
        "เมื่อฤดูใบไม้ผลิที่แล้ว ห้องนี้มีหนังสือเกี่ย"
        "วกับประวัติศาสตร์ วิทยาศาสตร์ และศิลปะมากกว่า"
        "สองหมื่นเล่ม และผู้อยู่อาศัยทุกคนใช้บริการได้"
        "ฟรี ผู้มาใช้บริการยืมหนังสือได้ครั้งละไม่เกิน"
        "สิบเล่มเป็นเวลาสามสัปดาห์ และเจ้าหน้าที่จะสั่"
        "งซื้อหนังสือที่ห้องสมุดไม่มีให้ ในวันหยุดสุดส"
        "ัปดาห์ ห้องสมุดจัดชั้นเรียนการอ่านสำหรับเด็กแ"
        "ละสอนการใช้คอมพิวเตอร์สำหรับผู้สูงอายุ นับตั้"
        "งแต่ห้องเปิด จำนวนผู้มาเยือนเพิ่มขึ้นเกือบเท่"
        "าตัว และตอนนี้นักเรียนจำนวนมากมาอ่านหนังสือที"
        "่นี่ทุกเย็น"
    ),
}


@pytest.mark.parametrize("language", sorted(set(LIBRARY) - {"en"}))
def test_a_translated_paragraph_scores_like_the_english_one(language):
    english, translated = score_general(LIBRARY["en"]), score_general(LIBRARY[language])
    for dimension in GENERAL.dimensions:
        assert abs(translated[dimension] - english[dimension]) <= 1, (dimension, translated, english)
    assert abs(GENERAL.quality(translated) - GENERAL.quality(english)) <= 0.1, (translated, english)


@pytest.mark.parametrize("language", sorted(LIBRARY))
def test_repeated_lines_and_symbol_soup_score_below_prose_in_every_script(language):
    prose = GENERAL.quality(score_general(LIBRARY[language]))
    first_sentence = LIBRARY[language].split(" ")[0] if language == "th" else LIBRARY[language][:40]
    spam = GENERAL.quality(score_general((first_sentence + "\n") * 12))
    soup = GENERAL.quality(score_general(" ".join(f"#{word}# @@ ~~" for word in LIBRARY[language][:60])))
    assert spam < prose - 0.2 and soup < prose - 0.2, (spam, soup, prose)
