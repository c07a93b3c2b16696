"""Texts of the calibration and evaluation sets.

Every sentence here was written for cosycompile by its authors and is released under CC0-1.0
(see README.md). The two sets share no target text, no prompt text and no prompt audio.

PROMPTS: (voice, pitch, speed, text), spoken by espeak-ng as
``espeak-ng -v VOICE -p PITCH -s SPEED TEXT``. Chinese prompts use the ``cmn-latn-pinyin`` voice:
in espeak-ng 1.51 the plain ``cmn`` voice reads most Chinese characters as English-sounding pinyin
("tian one"), so its audio would not match its transcript. Prompts hold only words that espeak-ng
reads as written (no digits, no abbreviations), so ``prompt_text`` is exactly what is spoken.

TEXTS: target texts per language, in the order they are numbered. make_sets.py interleaves the
languages in the manifest (en, zh, mixed, en, ...) so that the first N items of either set, which
is what the build reads with ``max_items``, always mix all three languages.
"""

CALIB_PROMPTS = [
    ("en-us", 0, 160, "Good morning, the kettle is already on."),
    ("cmn-latn-pinyin", 50, 185, "今天天气很好，我们去散步吧。"),
    ("en-gb", 20, 150, "Please leave the parcel by the blue door."),
    ("cmn-latn-pinyin+f3", 60, 185, "请把窗户关上，外面有点冷。"),
    ("en-us+f3", 10, 170, "We counted forty two birds on the lake."),
    ("cmn-latn-pinyin+m3", 35, 155, "这本书我已经看了两遍。"),
    ("en-gb+m3", 30, 140, "The train was late again this evening."),
    ("cmn-latn-pinyin+f2", 70, 195, "明天早上八点在学校门口见面。"),
    ("en-us+f2", 40, 175, "Could you read that number back to me?"),
    ("cmn-latn-pinyin+m2", 25, 175, "他每天骑自行车去上班。"),
    ("en-us+m2", 5, 155, "Turn left after the old stone bridge."),
    ("cmn-latn-pinyin+f4", 55, 160, "超市里的苹果今天打折。"),
    ("en-gb+f4", 25, 165, "My sister grows tomatoes on her balcony."),
    ("cmn-latn-pinyin", 20, 170, "小猫躺在沙发上晒太阳。"),
    ("en-us+m4", 15, 135, "The meeting moved to half past three."),
    ("cmn-latn-pinyin+m4", 45, 160, "雨下得很大，路上车很少。"),
]

EVAL_PROMPTS = [
    ("en-us+m1", 12, 158, "The lighthouse keeper waved from the rocks."),
    ("cmn-latn-pinyin+f1", 62, 165, "晚饭以后我们去看电影。"),
    ("en-gb+f1", 28, 148, "Every spring the orchard fills with bees."),
    ("cmn-latn-pinyin+m1", 30, 155, "她的声音听起来很温柔。"),
    ("en-us+f4", 38, 168, "A quiet street is hard to find downtown."),
    ("cmn-latn-pinyin+m5", 40, 150, "窗外的树叶慢慢变黄了。"),
]

CALIB_TEXTS = {
    "en": [
        "Thank you for calling, how can I help?",
        "Our flight, BA 287, now leaves at 10:15 from gate 14.",
        "When we moved into the old farmhouse, the first thing we noticed was the silence: no traffic, "
        "no sirens, only the wind in the poplars and, now and then, a dog barking somewhere far across the "
        "valley. It took us nearly two months to sleep through the night without waking up to wonder what "
        "was wrong.",
        "Hello, is anyone there?",
        "Remember to water the plants twice a week while I am away.",
        "Why does the printer always jam right before an important deadline?",
        "The recipe needs 3 eggs, 2 cups of flour, and a pinch of salt.",
        "After the concert, the audience stood and clapped for almost five minutes, and the conductor, "
        "who looked honestly surprised, bowed three times before waving the orchestra back for one more "
        "short piece that nobody had expected.",
        "Is this seat taken, or may I sit here?",
        "Temperatures will drop to minus 4 degrees overnight, so cover the roses.",
        "Your total comes to $19.99; would you like a receipt?",
        "She painted the fence green, then changed her mind and painted it white.",
        "Wow, that was the fastest lap of the whole season!",
        "Could you please explain, in simple words, why the bridge had to close for repairs last winter, "
        "how long the work is expected to take, and whether cyclists will still be allowed to cross on "
        "weekends?",
        "The library stays open from 8 a.m. until midnight during the exam period.",
        "Please confirm your appointment by replying YES or NO.",
        "He fixed the bicycle chain with nothing but a paper clip and a lot of patience.",
        "Gentle music played while the guests arrived.",
        "The museum's new exhibit shows how early sailors found their way across open water by watching "
        "the stars, the swell, and the flight of seabirds.",
        "Let's meet at the corner cafe, the one with the red awning.",
        "I left my umbrella on the bus, and of course it started to rain.",
        "Did you know the building has 52 floors but only 3 working elevators?",
        "Astronomers are tracking a faint comet that passes the sun roughly once every 120 years.",
        "Step one: unplug the router. Step two: wait 30 seconds. Step three: plug it back in and watch the "
        "lights.",
        "Honestly? I have no idea where the spare keys went.",
        "The committee will announce the results on Monday, March 3rd, at 2:30 in the afternoon.",
        "On quiet nights you can hear the waves from the top of the hill.",
        "If the light turns red, stop completely and wait for the green arrow before turning left.",
    ],
    "zh": [
        "请问最近的地铁站怎么走？",
        "我们下午3点开会，请不要迟到。",
        "周末我打算去爬山，顺便拍一些照片。听说山顶上有一座很老的寺庙，门口种着两棵银杏树，到了十一月叶子全黄了，"
        "远远看过去像两团金色的火。",
        "你好，请问王老师在吗？",
        "这家餐厅的饺子特别好吃，每次都要排队。",
        "今年夏天比去年热多了，空调一直开着。",
        "他把钥匙忘在办公室里了，只好回去拿。",
        "小时候我家住在一条很窄的巷子里，每天傍晚都能听到卖豆腐的老人摇着铃铛经过。后来巷子拆了，盖起了高楼，"
        "那个铃铛声我再也没有听到过，但我一直记得它的节奏。",
        "这个问题很复杂，我们需要更多的时间讨论。",
        "孩子们在操场上踢足球，笑声传得很远。",
        "请在下一个路口右转，然后直走500米。",
        "图书馆新到了一批科学杂志，欢迎大家借阅。",
        "你觉得这件蓝色的外套适合我吗？",
        "我们班一共有32个学生，其中15个是女生。",
        "明天可能会下大雨，出门记得带伞。",
        "这座桥建于1986年，已经有将近40年的历史。",
        "真没想到，这么小的城市也有这么好的博物馆！",
        "请大家注意：本次列车即将到达终点站，请带好您的随身物品，按顺序下车，不要拥挤，谢谢合作。",
        "医生建议他每天多喝水，少吃甜食。",
        "火车晚点了二十分钟，乘客们都很着急。",
        "电脑突然死机了，我写的文件还没有保存。",
        "这件衬衫原价两百元，现在打八折，只要160元。",
        "春天来了，河边的柳树长出了嫩绿的新芽。",
        "为什么每次我着急的时候，电梯都要等很久？",
        "妈妈做的红烧肉是全家人最喜欢的菜。",
        "你今天早上几点起床的？",
    ],
    "mixed": [
        "我今天要去 supermarket 买一些 snacks。",
        "这个 project 的 deadline 是下周五。",
        "我们 team 这个 quarter 的目标是把 response time 降到 200 毫秒以内，所以下周一的 meeting 上，"
        "每个人都要准备一个简短的 proposal，说明自己负责的模块打算怎么 optimize。",
        "Please 把那份 report 发给我。",
        "我们公司新来的 manager 人很好。",
        "手机的 battery 只剩 5% 了，谁有 charger？",
        "周末一起去看 movie 吧，我请你喝 coffee。",
        "I think 这个方案还不够好，we should 再讨论一下。",
        "他的 presentation 做得非常 professional。",
        "这个 app 的 update 修复了很多 bug，但是 login 页面还是很慢。",
        "Let me check 一下我的 schedule。",
        "昨天晚上我在 online shop 上买了一个 wireless keyboard，本来说 two days 就能到，结果今天收到 message "
        "说因为天气的原因要推迟到 next Monday，真是有点 disappointing。",
        "老师说 homework 要在 Friday 之前交。",
        "The new intern is really smart，而且做事特别认真，so I asked her to join the review.",
        "这家 hotel 的 breakfast 包括咖啡和 croissant。",
        "Our team 在比赛中拿了第一名，amazing！",
        "你的 flight 是几点的？要不要我开车送你去 airport？",
        "先 download 这个文件，然后 unzip 到桌面上。",
        "她每天早上都要去 gym 锻炼一个小时。",
        "The password 是 8 位数字加两个字母。",
        "我最喜欢的 band 下个月来这里开 concert，门票 380 块一张。",
        "OK，那我们就 Tuesday 下午 3 点见吧。",
    ],
}

EVAL_TEXTS = {
    "en": [
        "Could you remind me what time the museum closes today?",
        "The harbour lights flickered as the ferry pulled away.",
        "Forty seven people signed up for the Saturday workshop, but only 29 came.",
        "Oh no, I think I forgot to lock the back door!",
        "Every morning the baker arrives before sunrise to prepare the dough, and by seven o'clock the whole "
        "street smells of fresh bread; by nine the shelves are half empty, and by noon there is usually "
        "nothing left except a few crumbs and a handwritten sign that says: back tomorrow at 6.",
        "Turn the dial slowly until you hear a soft click.",
    ],
    "zh": [
        "请问这趟公交车经过人民广场吗？",
        "秋天的早晨，空气里有一股桂花的香味。",
        "他花了整整3个月才学会弹这首钢琴曲。",
        "太好了，终于放假了！",
        "我们村子后面有一条小河，夏天的时候孩子们常常在那里游泳，一直玩到天黑才回家。大人们总是站在岸边喊他们，"
        "可是没有一个人愿意早点上来，因为水里实在是太凉快了。",
        "这台洗衣机用了12年，还是跟新的一样好用。",
    ],
    "mixed": [
        "明天的 interview 你准备好了吗？",
        "这个 weekend 我们去 beach 烧烤吧。",
        "Sorry，我今天可能要晚一点到，因为 subway 出了点问题，整条线都停了，我打算换乘 bus 过去，"
        "估计 10 点半左右到，you can start without me。",
        "请把 meeting notes 整理好发到群里。",
        "我的 laptop 坏了，要拿去 repair，大概要花 500 块。",
        "Happy birthday！祝你每天都开开心心。",
    ],
}
